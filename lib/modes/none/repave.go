package none

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
)

// repaveInput is the file of a version directory built by a repave that
// holds the digest of its arguments (inputDigest).
const repaveInput = "repave-input"

// inputDigest names one set of Repave arguments.
func inputDigest(running string, s modes.Slot) (string, error) {
	h := sha256.New()
	node := s.Node
	// Secret marshals as a redaction: the token goes into the digest,
	// never into the journal.
	tok := sha256.Sum256([]byte(node.BootstrapToken.Reveal()))
	if err := json.NewEncoder(h).Encode(struct {
		Running, Slot string
		Node          modes.Node
		Token         string
	}{running, s.Name, node, hex.EncodeToString(tok[:])}); err != nil {
		return "", err
	}
	for _, p := range []string{s.Artifacts.Kubelet, s.Artifacts.Containerd, s.Artifacts.Runc, s.Artifacts.CNIPlugins} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		// lib/artifacts names its cache files after their digest and
		// never rewrites one in place: path, size and time identify the
		// content without reading a 100 MB kubelet again.
		fmt.Fprintf(h, "%s %d %d\n", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (m *Mode) writeJournal(j *repaveJournal) error {
	return state.WriteJournal(m.Paths, JournalName, j)
}

// Repave replaces the node stack in place (ARCHITECTURE section 2):
//
//  1. install s as a new version directory beside the running one
//     (named after s.Node.KubernetesVersion, or "<v>_2" when that name is
//     the running version's), the running stack untouched;
//  2. stop kubelet, then containerd; kill what they leave (pods: the
//     caller drained the node, so what is left are DaemonSet and static
//     pods, bound to a Node the caller deletes and running in network
//     namespaces about to be removed; the new kubelet starts them
//     again); clean the host networking the old stack made
//     (cleanHostNetwork);
//  3. run the fence (h.Fence; the caller deletes the Node there, now
//     that no kubelet runs to register it again);
//  4. set the bridge CNI configuration from the new version, flip
//     `current`;
//  5. start containerd and kubelet (their start runs the fence again,
//     through the generator's drop-in) and wait healthy (h.Healthy).
//
// A failure at any step rolls back: the stack is stopped and cleaned
// again, `current` and the CNI configuration go back to the old version
// (binaries and the configuration it ran, both in its directory), the
// old stack is started and waited healthy, and the new version is
// removed. The error says so and wraps modes.ErrRolledBack. The old
// stack's start is fenced too (h.Fence again, then the generator's
// drop-in on the units): a fence that refuses makes the rollback fail,
// and the node stays down, as a fenced node must.
//
// The old version directory is not removed on success: the caller
// records the new applied config, then calls RemoveSuperseded (a repave
// that starts while an old one is still there removes it, and so does
// EnsureHooks once the applied record names the current version). A
// call with the same arguments after success (the caller crashed before
// its record) finds the current version installed from them
// (repaveInput) and returns nil.
//
// The steps (stepBuilt, stepFlipped, stepHealthy) run on lib/steps with
// the mode's journal (JournalName): a call with the same arguments after
// a crash finishes the repave, or its rollback (the undos of the steps
// done, in reverse); a call with other arguments first rolls back the
// unfinished one. Crash points: CrashPoints, then RollbackCrashPoints.
func (m *Mode) Repave(ctx context.Context, running string, s modes.Slot, h modes.RepaveHooks) error {
	if !hostpaths.ValidSlot(running) {
		return fmt.Errorf("none repave: running slot %q: must be one of %v", running, hostpaths.Slots)
	}
	if err := s.Check(); err != nil {
		return fmt.Errorf("none repave: %w", err)
	}
	v := s.Node.KubernetesVersion
	if !versionRE.MatchString(v) {
		return fmt.Errorf("none repave: version %q cannot name a directory", v)
	}
	if err := h.Check(); err != nil {
		return fmt.Errorf("none repave: %w", err)
	}
	if h.Crash == nil {
		h.Crash = func(string) {}
	}
	in, err := inputDigest(running, s)
	if err != nil {
		return fmt.Errorf("none repave: %w", err)
	}
	var j repaveJournal
	ok, err := state.ReadJournal(m.Paths, JournalName, &j)
	if err != nil {
		// Never resume from a journal that cannot be trusted, and never
		// start over it: what it would undo is unknown.
		return fmt.Errorf("none repave: %w", err)
	}
	if ok {
		done, err := j.migrate()
		if err != nil {
			return fmt.Errorf("none repave: journal %s: %w", m.Paths.Journal(JournalName), err)
		}
		if done {
			if err := state.RemoveJournal(m.Paths, JournalName); err != nil {
				return fmt.Errorf("none repave: %w", err)
			}
			ok = false
		}
	}
	if ok && j.Input != in {
		m.log().Warn("an unfinished repave of other arguments is rolled back first", "journal", m.Paths.Journal(JournalName), "old", j.Old, "new", j.New, "step", j.Step)
		run, list := m.repaveSteps(s, &j, h)
		if err := m.rolledBack(&j, run.RollBack(ctx, list, "a repave of other arguments replaces it")); err != nil && !errors.Is(err, modes.ErrRolledBack) {
			return err
		}
		ok = false
	}
	if ok {
		args := []any{"mode", "none", "step", j.Step, "old", j.Old, "new", j.New}
		if j.RollingBack != "" {
			args = append(args, "rolling_back", j.RollingBack)
		}
		m.log().Info("repave resumed", args...)
	} else {
		// Done already: the caller ran again after Repave returned nil
		// and before it recorded the new applied config.
		if cur, err := m.CurrentVersion(); err == nil && cur != "" {
			if got, err := os.ReadFile(filepath.Join(m.VersionDir(cur), repaveInput)); err == nil && strings.TrimSpace(string(got)) == in {
				m.log().Info("repave done already: the current version was installed from these arguments", "mode", "none", "version", cur)
				return nil
			}
		}
		j, err = m.beginRepave(running, s, in)
		if err != nil {
			return fmt.Errorf("none repave: %w", err)
		}
	}
	run, list := m.repaveSteps(s, &j, h)
	begin := time.Now()
	if err := run.Run(ctx, list); err != nil {
		return m.rolledBack(&j, err)
	}
	m.log().Info("repave done: the new version runs; the old one stays until the new applied config is recorded", "mode", "none", "old", j.Old, "new", j.New, "took", time.Since(begin).Round(time.Millisecond).String())
	return nil
}

// beginRepave opens the journal of a new repave.
func (m *Mode) beginRepave(running string, s modes.Slot, in string) (repaveJournal, error) {
	old, err := m.CurrentVersion()
	if err != nil {
		return repaveJournal{}, err
	}
	if old == "" {
		return repaveJournal{}, fmt.Errorf("no version is installed (%s does not exist): nothing runs to be repaved", filepath.Join(m.Paths.VersionsDir(), "current"))
	}
	if fi, err := os.Stat(m.VersionDir(old)); err != nil || !fi.IsDir() {
		return repaveJournal{}, fmt.Errorf("current points at %s, which is no version directory (%v)", old, err)
	}
	// Versions other than the running one are superseded (a repave whose
	// caller never called RemoveSuperseded, a crash): they go first.
	if err := m.removeVersionsBut(old); err != nil {
		return repaveJournal{}, err
	}
	// A version installed before versions kept their CNI configuration
	// (cniCopy) gets the live one: it is the configuration it runs, and
	// what a rollback restores.
	live := m.Paths.Join(filepath.Join(Layout.CNIConfDir, nodestack.CNIConfName))
	if data, err := os.ReadFile(live); err == nil {
		if _, err := os.Stat(filepath.Join(m.VersionDir(old), cniCopy)); errors.Is(err, os.ErrNotExist) {
			if err := nodestack.WriteFile(m.VersionDir(old), "/"+cniCopy, data, 0o644); err != nil {
				return repaveJournal{}, err
			}
		}
	}
	name := s.Node.KubernetesVersion
	for i := 2; name == old; i++ {
		name = fmt.Sprintf("%s_%d", s.Node.KubernetesVersion, i)
	}
	j := repaveJournal{Format: journalSteps, Running: running, Slot: s.Name, Input: in, Old: old, New: name, Version: s.Node.KubernetesVersion}
	if err := m.writeJournal(&j); err != nil {
		return repaveJournal{}, err
	}
	m.log().Info("repave begun", "mode", "none", "running", running, "slot", s.Name, "old", old, "new", name)
	return j, nil
}

// repaveSteps is the runner of j's repave and its steps (see Repave).
func (m *Mode) repaveSteps(s modes.Slot, j *repaveJournal, h modes.RepaveHooks) (*steps.Runner, []steps.Step) {
	run := &steps.Runner{Paths: m.Paths, Operation: "repave", JournalName: JournalName, Journal: j, CrashPoint: h.Crash, Log: m.log()}
	crash := h.Crash
	// The error of a step names the version it acts on; an undo's says
	// what of the rollback failed.
	in := func(what string, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	return run, []steps.Step{{
		Name: stepBuilt,
		Run: func(context.Context) error {
			if err := m.install(s, j.New); err != nil {
				return in("install version "+j.New, err)
			}
			return in("install version "+j.New, state.WriteFileAtomic(filepath.Join(m.VersionDir(j.New), repaveInput), []byte(j.Input+"\n"), 0o644))
		},
		Undo: func(context.Context) error {
			if j.New == j.Old {
				return nil
			}
			return in("remove version "+j.New, modes.RemoveVerified(m.VersionDir(j.New)))
		},
	}, {
		Name: stepFlipped,
		Run: func(ctx context.Context) error {
			if err := m.stopUnits(ctx); err != nil {
				return in("stop version "+j.Old, err)
			}
			crash("repave/after-old-stopped")
			if err := m.cleanNetwork(ctx); err != nil {
				return in("clean the host networking of version "+j.Old, err)
			}
			crash("repave/after-network-cleaned")
			// The fence runs once the old kubelet is stopped (the
			// caller's hook deletes the Node first, which a running
			// kubelet would register again) and before anything of the
			// new version is live.
			if err := h.Fence(ctx); err != nil {
				return in("the allocation fence", err)
			}
			crash("repave/after-fence")
			if err := m.setCNIConf(j.New); err != nil {
				return in("CNI configuration of version "+j.New, err)
			}
			return in("flip current to "+j.New, m.flipCurrent(j.New))
		},
		Undo: func(ctx context.Context) error {
			j.Stopped = true
			if err := m.stopStack(ctx); err != nil {
				return in("stop version "+j.New, err)
			}
			if err := m.setCNIConf(j.Old); err != nil {
				return in("CNI configuration", err)
			}
			if err := m.flipCurrent(j.Old); err != nil {
				return in("flip current back", err)
			}
			// The old stack's start is fenced like the new one's (the
			// contract of RepaveHooks.Fence): a refusal starts nothing.
			if err := h.Fence(ctx); err != nil {
				return in("the allocation fence", err)
			}
			if err := m.startStack(ctx, j.Running); err != nil {
				return in("start version "+j.Old, err)
			}
			return in("version "+j.Old+" did not become healthy again", h.Healthy(ctx, j.Running))
		},
	}, {
		Name:  stepHealthy,
		Final: true,
		Run: func(ctx context.Context) error {
			if err := m.startStack(ctx, j.Slot); err != nil {
				return in("start version "+j.New, err)
			}
			crash("repave/after-new-started")
			return in("version "+j.New+" did not become healthy", h.Healthy(ctx, j.Slot))
		},
	}}
}

// rolledBack turns what the runner of j's repave returned into Repave's
// error: a finished rollback removes the journal and wraps
// modes.ErrRolledBack; an unfinished one says what failed and keeps the
// journal rolling back, for the next call to finish.
func (m *Mode) rolledBack(j *repaveJournal, err error) error {
	var rb *steps.RolledBackError
	var ue *steps.UndoError
	switch {
	case errors.As(err, &rb):
		if err := state.RemoveJournal(m.Paths, JournalName); err != nil {
			return fmt.Errorf("none repave to version %s failed (%s), and the rollback to version %s failed: remove the journal: %w", j.New, rb.Reason, j.Old, err)
		}
		how := "it never stopped"
		if j.Stopped {
			how = "started again with the configuration it ran"
		}
		return fmt.Errorf("none repave to version %s failed (%s); rolled back: version %s runs (%s), version %s removed: %w", j.New, rb.Reason, j.Old, how, j.New, modes.ErrRolledBack)
	case errors.As(err, &ue):
		return fmt.Errorf("none repave to version %s failed (%s), and the rollback to version %s failed: %w", j.New, ue.Reason, j.Old, ue.Err)
	}
	return fmt.Errorf("none repave: %w", err)
}

// RemoveSuperseded removes the version directories `current` does not
// point at. The caller of Repave (lib/repave) calls it once it has
// recorded the new applied config; the next repave and EnsureHooks (once
// the record names the current version) do it too. It refuses while a
// repave is unfinished (its journal is there).
func (m *Mode) RemoveSuperseded(ctx context.Context) error {
	var j repaveJournal
	ok, err := state.ReadJournal(m.Paths, JournalName, &j)
	if err != nil {
		return err
	}
	if ok && j.unfinished() {
		return fmt.Errorf("a repave from version %s to %s is unfinished (step %s): no version is superseded yet", j.Old, j.New, j.Step)
	}
	cur, err := m.CurrentVersion()
	if err != nil {
		return err
	}
	if cur == "" {
		return fmt.Errorf("no version is current (%s): refusing to remove any", filepath.Join(m.Paths.VersionsDir(), "current"))
	}
	if err := m.removeVersionsBut(cur); err != nil {
		return err
	}
	if ok {
		// A finished repave's journal of an earlier build.
		if err := state.RemoveJournal(m.Paths, JournalName); err != nil {
			return err
		}
	}
	return nil
}

// removeVersionsBut removes every version directory but keep (and what
// an interrupted build left).
func (m *Mode) removeVersionsBut(keep string) error {
	versions := m.Paths.VersionsDir()
	if err := removeLeftovers(versions); err != nil {
		return err
	}
	ents, err := os.ReadDir(versions)
	if err != nil {
		return err
	}
	var gone []string
	for _, e := range ents {
		if e.Name() == "current" || e.Name() == keep || !e.IsDir() {
			continue
		}
		gone = append(gone, filepath.Join(versions, e.Name()))
	}
	if len(gone) > 0 {
		m.log().Info("superseded versions removed", "mode", "none", "versions", gone)
	}
	return modes.RemoveVerified(gone...)
}

// stopStack stops the node stack and cleans the host networking it made.
func (m *Mode) stopStack(ctx context.Context) error {
	if err := m.stopUnits(ctx); err != nil {
		return err
	}
	return m.cleanNetwork(ctx)
}

// stopUnits stops the node stack's units (stopOrder) and kills what
// outlives them (pods, shims).
func (m *Mode) stopUnits(ctx context.Context) error {
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	begin := time.Now()
	took := []any{"mode", "none"}
	for _, u := range stopOrder {
		// A stop of a unit that is not running is no error; one in its
		// Restart= delay (a kubelet that exits at once) is stopped too.
		if err := sd.StopUnit(ctx, u); err != nil {
			return err
		}
		took = append(took, u, time.Since(begin).Round(time.Millisecond).String())
	}
	if err := m.killLeftovers(ctx); err != nil {
		return err
	}
	m.log().Info("node stack stopped", append(took, "took", time.Since(begin).Round(time.Millisecond).String())...)
	return nil
}

// cleanNetwork is CleanNetwork, or cleanHostNetwork.
func (m *Mode) cleanNetwork(ctx context.Context) error {
	if m.CleanNetwork != nil {
		return m.CleanNetwork(ctx)
	}
	return m.cleanHostNetwork(ctx)
}

// resetFailer is the part of lib/units.Manager beyond modes.Systemd that
// startStack uses when the connection has it.
type resetFailer interface {
	ResetFailed(ctx context.Context, unit string) error
}

// startStack starts containerd and kubelet after a daemon-reload (Start),
// first forgetting a failed state and its start limit: a kubelet that
// exited at once in the version rolled back from may have hit it, and
// systemd would refuse to start the unit ("start request repeated too
// quickly").
func (m *Mode) startStack(ctx context.Context, slot string) error {
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	if r, ok := sd.(resetFailer); ok {
		for _, u := range []string{ContainerdUnit, KubeletUnit} {
			if err := r.ResetFailed(ctx, u); err != nil {
				sd.Close()
				return err
			}
		}
	}
	sd.Close()
	return m.Start(ctx, slot)
}

// cleanHostNetwork removes what the node stack made in the host's
// network and what no process of it uses any more once it is stopped
// and its pods are killed: the pods' veth pairs and the bridge (cni0),
// their network namespaces (containerd's /run/netns/cni-*),
// host-local's address reservations of the bridge network, and the
// iptables chains of the CNI plugins (CNI-*: the bridge's masquerade
// chains, portmap's CNI-HOSTPORT-*) with the rules that jump to them.
// kubelet's own chains (KUBE-*) are left: it keeps them current itself
// at every start.
func (m *Mode) cleanHostNetwork(ctx context.Context) error {
	var errs []error
	sysNet := m.SysClassNet
	if sysNet == "" {
		sysNet = "/sys/class/net"
	}
	del := m.DeleteLink
	if del == nil {
		del = deleteLink
	}
	// The pods' veth pairs, by their host ends on the bridge (deleting
	// one end deletes the pair), then the bridge.
	veths, _ := os.ReadDir(filepath.Join(sysNet, bridgeName, "brif"))
	for _, v := range veths {
		if err := del(v.Name()); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete interface %s: %w", v.Name(), err))
		}
	}
	if _, err := os.Stat(filepath.Join(sysNet, bridgeName)); err == nil {
		if err := del(bridgeName); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete interface %s: %w", bridgeName, err))
		}
	}
	// The pods' network namespaces, empty now. Unmounting needs
	// CAP_SYS_ADMIN and the mount system calls; a caller sandboxed
	// without them leaves them to containerd, which removes a sandbox's
	// namespace when the new kubelet removes the dead sandbox.
	netns, _ := filepath.Glob(m.Paths.Join("/run/netns/cni-*"))
	umount := m.Unmount
	if umount == nil {
		umount = defaultUnmount
	}
	left := 0
	for _, ns := range netns {
		if err := umount(ns); err != nil && !isNotMounted(err) {
			if errors.Is(err, unix.EPERM) {
				left++
				continue
			}
			errs = append(errs, fmt.Errorf("unmount %s: %w", ns, err))
			continue
		}
		if err := os.Remove(ns); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if left > 0 {
		m.log().Warn("pod network namespaces left to containerd: not allowed to unmount them here", "netns", left)
	}
	run := m.Command
	if run == nil {
		run = runCommand
	}
	if err := modes.RemoveVerified(m.Paths.Join("/var/lib/cni/networks/" + cniNetwork)); err != nil {
		errs = append(errs, err)
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		if err := m.removeCNIChains(ctx, run, fam); err != nil {
			errs = append(errs, err)
		}
	}
	if len(netns) > 0 || len(veths) > 0 {
		m.log().Info("host networking of the old node stack cleaned", "netns", len(netns), "veths", len(veths))
	}
	return errors.Join(errs...)
}

// removeCNIChains drops the CNI-* chains, and every rule that jumps to
// one, from the nat and filter tables of fam ("iptables", "ip6tables"),
// with the tool the CNI plugins themselves use (go-iptables runs
// `iptables`, never iptables-save, which some hosts lack): `-S` lists a
// table, a jump is deleted by its chain and position (last first, so
// that the positions before it hold), then each CNI chain is flushed and
// deleted. A host without the tool, or a table the kernel does not have,
// has nothing of CNI's.
func (m *Mode) removeCNIChains(ctx context.Context, run func(context.Context, []byte, string, ...string) ([]byte, error), fam string) error {
	if m.Command == nil {
		if _, err := exec.LookPath(fam); err != nil {
			return nil
		}
	}
	for _, table := range []string{"nat", "filter"} {
		listed, err := run(ctx, nil, fam, "-w", "-t", table, "-S")
		if err != nil {
			m.log().Warn("iptables table not read: nothing to clean in it", "family", fam, "table", table, "error", err.Error())
			continue
		}
		jumps, chains := cniRules(listed)
		if len(jumps) == 0 && len(chains) == 0 {
			continue
		}
		for _, j := range jumps {
			if _, err := run(ctx, nil, fam, "-w", "-t", table, "-D", j.chain, strconv.Itoa(j.pos)); err != nil {
				return fmt.Errorf("%s -t %s -D %s %d (a jump to %s): %w", fam, table, j.chain, j.pos, j.target, err)
			}
		}
		for _, verb := range []string{"-F", "-X"} {
			for _, c := range chains {
				if _, err := run(ctx, nil, fam, "-w", "-t", table, verb, c); err != nil {
					return fmt.Errorf("%s -t %s %s %s: %w", fam, table, verb, c, err)
				}
			}
		}
		m.log().Info("CNI iptables chains removed", "family", fam, "table", table, "chains", len(chains), "jumps", len(jumps))
	}
	return nil
}

// cniJump is a rule of a chain that is not CNI's jumping to one that is.
type cniJump struct {
	chain  string
	pos    int // 1-based, as -D takes it
	target string
}

// cniRules reads `iptables -S` output: the jumps to CNI-* chains from
// other chains (in the order to delete them: within a chain, last
// first) and the CNI-* chains.
func cniRules(listed []byte) (jumps []cniJump, chains []string) {
	pos := map[string]int{}
	for _, line := range strings.Split(string(listed), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "-N" && strings.HasPrefix(f[1], "CNI-"):
			chains = append(chains, f[1])
		case len(f) >= 2 && f[0] == "-A":
			pos[f[1]]++
			if strings.HasPrefix(f[1], "CNI-") {
				continue
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && strings.HasPrefix(f[i+1], "CNI-") {
					jumps = append(jumps, cniJump{chain: f[1], pos: pos[f[1]], target: f[i+1]})
					break
				}
			}
		}
	}
	slices.SortStableFunc(jumps, func(a, b cniJump) int {
		if a.chain != b.chain {
			return strings.Compare(a.chain, b.chain)
		}
		return b.pos - a.pos
	})
	return jumps, chains
}

// runCommand runs name and returns its standard output; a failure's
// error carries its standard error.
func runCommand(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	c := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	c.Stdout = &out
	c.Stderr = &stderr
	if err := c.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out.Bytes(), nil
}

// The bridge CNI configuration's names (lib/modes/nodestack's conflist):
// the bridge it makes and the network host-local keeps reservations of.
const (
	bridgeName = "cni0"
	cniNetwork = "unbounded"
)

// deleteLink deletes a network interface by name over rtnetlink
// (RTM_DELLINK), as `ip link delete` does, without needing iproute2.
func deleteLink(name string) error {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	msg := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], unix.RTM_DELLINK)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:12], 1)
	// struct ifinfomsg: family, pad, type, index, flags, change.
	binary.NativeEndian.PutUint32(msg[unix.NLMSG_HDRLEN+4:], uint32(ifi.Index))
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			if e := int32(binary.NativeEndian.Uint32(m.Data[0:4])); e != 0 {
				return syscall.Errno(-e)
			}
			return nil
		}
	}
	return fmt.Errorf("no answer from the kernel to RTM_DELLINK %s", name)
}

func defaultUnmount(target string) error { return unix.Unmount(target, unix.MNT_DETACH) }

func isNotMounted(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, os.ErrNotExist)
}
