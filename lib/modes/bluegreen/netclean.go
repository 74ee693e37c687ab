package bluegreen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// CNIBridge is the bridge the node stack's bridge CNI config makes
// (lib/modes/nodestack's CNI config) in the host's network namespace.
const CNIBridge = "cni0"

// ownedChainPrefixes are the iptables chains the node stack makes in the
// host's network namespace (the machine shares it): kubelet's KUBE-*
// (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) and the CNI plugins' CNI-*
// (bridge's masquerade chains per container, portmap's CNI-HOSTPORT-*).
var ownedChainPrefixes = []string{"KUBE-", "CNI-"}

// CleanHostNetwork removes what the stopped node stack of slot left in
// the host's network namespace, for a mode whose node stack runs in a
// rootfs of its own per slot in that namespace (nspawn, container):
// rootOf gives a slot's rootfs on the host. It removes the node stack's
// iptables chains (and the rules that jump to them) in every table, for
// IPv4 and IPv6, and the CNI bridge. The pods' veth ends went with their
// network namespaces when the node stopped. It is best effort: every
// step is logged, none fails the repave, because the next node stack
// makes its own chains and bridge again whatever is left (a stale rule
// can only be redundant). The iptables tools are the node image's own
// (the host may have none), run chrooted in the slot's rootfs, or the
// other slot's when that one is gone; with neither the chains are left
// and a line says so.
func CleanHostNetwork(ctx context.Context, log *slog.Logger, rootOf func(slot string) string, slot string) {
	start := time.Now()
	removed, tried := 0, false
	for _, fam := range []string{"iptables", "ip6tables"} {
		n, err := cleanFamily(ctx, rootOf, slot, fam)
		if errors.Is(err, errNoTools) {
			continue
		}
		tried = true
		removed += n
		if err != nil {
			log.Warn("host networking: chains not cleaned", "tool", fam, "error", err.Error())
		}
	}
	if !tried {
		log.Warn("host networking: no iptables-save and iptables-restore in either slot's rootfs; the node stack's iptables chains are left to the next node stack", "slot", slot)
	}
	bridge := "absent"
	if err := deleteBridge(CNIBridge); err == nil {
		bridge = "removed"
	} else if !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENXIO) {
		bridge = "left: " + err.Error()
		log.Warn("host networking: CNI bridge not removed", "bridge", CNIBridge, "error", err.Error())
	}
	log.Info("host networking of the stopped node cleaned", "slot", slot, "chains_removed", removed,
		"bridge_"+CNIBridge, bridge, "took", time.Since(start).Round(time.Millisecond).String())
}

// owned reports whether chain is one of the node stack's.
func owned(chain string) bool {
	for _, p := range ownedChainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// filterOwned drops from an iptables-save dump the owned chains, their
// rules and every rule that jumps (-j) or goes (-g) to one. It returns
// the dump to restore and how many chains it dropped.
func filterOwned(dump []byte) ([]byte, int) {
	var out bytes.Buffer
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(dump))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if owned(name) {
				n++
				continue
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) > 1 && owned(f[1]) {
				continue
			}
			skip := false
			for i := 0; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g" || f[i] == "--jump" || f[i] == "--goto") && owned(f[i+1]) {
					skip = true
				}
			}
			if skip {
				continue
			}
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes(), n
}

// iptablesTables are the tables the node stack's chains live in.
var iptablesTables = []string{"filter", "nat", "mangle", "raw"}

// errNoTools: neither slot's rootfs has a working pair of save and
// restore tools of a family.
var errNoTools = errors.New("no iptables tools")

// cleanFamily removes the owned chains of one family (iptables or
// ip6tables) with the tools of the slot's rootfs, else the other slot's.
// The tools are tried under their plain names first (the backend the
// node image selected, the one its kubelet used), then as the legacy
// ones; a link that leads nowhere inside the rootfs is skipped.
func cleanFamily(ctx context.Context, rootOf func(slot string) string, slot, family string) (int, error) {
	for _, s := range []string{slot, hostpaths.OtherSlot(slot)} {
		root := rootOf(s)
		if _, err := os.Stat(filepath.Join(root, "usr")); err != nil {
			continue
		}
		for _, pair := range [][2]string{{family + "-save", family + "-restore"}, {family + "-legacy-save", family + "-legacy-restore"}} {
			// Table by table: without a /proc in the chroot the tools
			// cannot list the tables, and a table whose module is not
			// loaded has nothing of the node's.
			removed, found := 0, false
			var errs []error
			for _, table := range iptablesTables {
				dump, err := chrootRun(ctx, root, nil, "/usr/sbin/"+pair[0], "-t", table)
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
					break
				}
				found = true
				if err != nil {
					continue // no such table here
				}
				kept, n := filterOwned(dump)
				if n == 0 {
					continue
				}
				if _, err := chrootRun(ctx, root, kept, "/usr/sbin/"+pair[1]); err != nil {
					errs = append(errs, err)
					continue
				}
				removed += n
			}
			if found {
				return removed, errors.Join(errs...)
			}
		}
	}
	return 0, errNoTools
}

// chrootRun runs name chrooted in rootfs, in the host's network namespace,
// with stdin, and returns its stdout.
func chrootRun(ctx context.Context, rootfs string, stdin []byte, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s (in %s): %w: %s", name, rootfs, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// deleteBridge takes the bridge down and deletes it (SIOCBRDELBR, as
// brctl delbr does). A bridge that does not exist is ENXIO or ENODEV.
func deleteBridge(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() &^ unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return err
	}
	b, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCBRDELBR, uintptr(unsafe.Pointer(b))); errno != 0 {
		return errno
	}
	return nil
}
