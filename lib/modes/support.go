// This file answers `unbounded supports-isolation MODE`: can this build
// operate MODE on this host, and if not, why not.

package modes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/lib/modes/facts"
)

// ErrUnsupported means a mode cannot run on this host; the error says why.
var ErrUnsupported = errors.New("isolation mode not supported on this host")

// Host is how the support checks look at the host. Each field's zero
// value is the real host; tests replace them.
type Host struct {
	// LookPath finds an executable (exec.LookPath).
	LookPath func(name string) (string, error)
	// Stat stats a path (os.Stat).
	Stat func(path string) (fs.FileInfo, error)
	// ReadFile reads a file (os.ReadFile); used for /proc/self/mountinfo
	// and cgroup.controllers.
	ReadFile func(path string) ([]byte, error)
}

func (h Host) lookPath(name string) (string, error) {
	if h.LookPath != nil {
		return h.LookPath(name)
	}
	return exec.LookPath(name)
}

func (h Host) stat(p string) (fs.FileInfo, error) {
	if h.Stat != nil {
		return h.Stat(p)
	}
	return os.Stat(p)
}

func (h Host) readFile(p string) ([]byte, error) {
	if h.ReadFile != nil {
		return h.ReadFile(p)
	}
	return os.ReadFile(p)
}

// Support is the answer for one mode.
type Support struct {
	Mode string `json:"mode"`
	// Experimental: the mode works but is not yet for production
	// (container).
	Experimental bool `json:"experimental,omitempty"`
	// Cgroup is the hierarchy the node stack would get: "unified" or
	// "legacy" (nspawn and container).
	Cgroup string `json:"cgroup,omitempty"`
	// Missing lists every unmet requirement; empty means supported.
	Missing []string `json:"missing,omitempty"`
}

// Err is nil when the mode is supported, else ErrUnsupported with every
// reason.
func (s Support) Err() error {
	if len(s.Missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrUnsupported, s.Mode, strings.Join(s.Missing, "; "))
}

// KubeletControllers are the cgroup controllers a kubelet cannot run
// without. A hierarchy that lacks one is not usable for a node stack.
var KubeletControllers = []string{"cpu", "memory", "pids"}

// systemdBooted is sd_booted(3)'s test: systemd creates this directory
// when it is PID 1.
const systemdBooted = "/run/systemd/system"

// Check answers whether this build can operate mode on this host:
//   - nspawn needs systemd-nspawn, systemd as init (it runs as
//     systemd-nspawn@<slot>.service) and a cgroup hierarchy carrying the
//     kubelet's controllers;
//   - container (experimental) needs what nspawn needs: its runtime is
//     systemd-nspawn's OCI runtime (--oci-bundle), run as
//     unbounded-container@<slot>.service;
//   - none needs systemd (unbounded-kubelet.service and friends).
//
// An unknown mode is reported as missing too, never as supported.
func (h Host) Check(mode string) Support {
	s := Support{Mode: mode}
	needSystemd := func() {
		if fi, err := h.stat(systemdBooted); err != nil || !fi.IsDir() {
			s.Missing = append(s.Missing, "systemd is not the init system ("+systemdBooted+" does not exist)")
		}
	}
	m, known := facts.Lookup(mode)
	s.Experimental = m.Experimental
	switch {
	case m.InMachine:
		if _, err := h.lookPath("systemd-nspawn"); err != nil {
			s.Missing = append(s.Missing, "systemd-nspawn is not installed (Debian/Ubuntu: package systemd-container)")
		}
		needSystemd()
		cg, err := h.CgroupHierarchy()
		if err != nil {
			s.Missing = append(s.Missing, err.Error())
		}
		s.Cgroup = cg
	case known:
		needSystemd()
	default:
		s.Missing = append(s.Missing, fmt.Sprintf("unknown isolation mode %q (%s)", mode, strings.Join(facts.Names(), ", ")))
	}
	return s
}

// mount is one cgroup line of /proc/self/mountinfo.
type mount struct {
	point   string
	fstype  string   // cgroup or cgroup2
	options []string // super options: the v1 controllers, name=systemd
}

func (h Host) cgroupMounts() ([]mount, error) {
	data, err := h.readFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cannot read the mount table: %w", err)
	}
	var out []mount
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		out = append(out, mount{point: UnescapeMountinfo(f[4]), fstype: g[0], options: strings.Split(g[2], ",")})
	}
	return out, nil
}

// UnescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func UnescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// CgroupHierarchy says which cgroup hierarchy a node stack gets here:
// "legacy" when the kubelet's controllers are bound to cgroup v1 (hybrid
// hosts included: a controller bound to v1 is absent from cgroup2), and
// "unified" when the cgroup2 hierarchy at /sys/fs/cgroup carries them all.
// The nspawn mode never assumes one: a unified machine on a host whose
// controllers are in v1 has no working cpu/memory/pids controllers.
func (h Host) CgroupHierarchy() (string, error) {
	mounts, err := h.cgroupMounts()
	if err != nil {
		return "", err
	}
	v1 := map[string]bool{}
	systemdV1 := false
	var v2 []string // mount points of cgroup2
	for _, m := range mounts {
		switch m.fstype {
		case "cgroup":
			for _, o := range m.options {
				v1[o] = true
				if o == "name=systemd" {
					systemdV1 = true
				}
			}
		case "cgroup2":
			v2 = append(v2, m.point)
		}
	}
	var inV1 []string
	for _, c := range KubeletControllers {
		if v1[c] {
			inV1 = append(inV1, c)
		}
	}
	if len(inV1) == len(KubeletControllers) {
		if !systemdV1 && len(v2) == 0 {
			return "", errors.New("no usable cgroup hierarchy: controllers are in cgroup v1 but there is no name=systemd or cgroup2 hierarchy for systemd")
		}
		return "legacy", nil
	}
	if len(inV1) > 0 {
		return "", fmt.Errorf("no usable cgroup hierarchy: controllers split between v1 (%s) and v2", strings.Join(inV1, ", "))
	}
	if !slices.Contains(v2, "/sys/fs/cgroup") {
		return "", errors.New("no usable cgroup hierarchy: neither cgroup v1 controllers nor cgroup2 at /sys/fs/cgroup")
	}
	data, err := h.readFile(filepath.Join("/sys/fs/cgroup", "cgroup.controllers"))
	if err != nil {
		return "", fmt.Errorf("no usable cgroup hierarchy: %w", err)
	}
	have := strings.Fields(string(data))
	var missing []string
	for _, c := range KubeletControllers {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("no usable cgroup hierarchy: cgroup2 lacks the %s controller(s)", strings.Join(missing, ", "))
	}
	return "unified", nil
}
