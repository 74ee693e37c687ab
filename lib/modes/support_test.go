package modes

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"unbounded-cloud.io/agent/tests/tiers"
)

// Mount tables as the kernel writes them, trimmed to the cgroup lines.
const (
	// The test VMs here: every controller bound to v1, cgroup2 at
	// /sys/fs/cgroup/unified for systemd (hybrid).
	mountsHybrid = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
`
	mountsUnified = `25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	mountsSplit = `32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
25 22 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
`
	mountsNone = `1 0 8:1 / / rw - ext4 /dev/sda1 rw
`
)

type fakeHost struct {
	bins  []string
	files fstest.MapFS // paths without the leading slash
}

func (f fakeHost) host() Host {
	return Host{
		LookPath: func(name string) (string, error) {
			if slices.Contains(f.bins, name) {
				return "/usr/bin/" + name, nil
			}
			return "", errors.New("not found")
		},
		Stat:     func(p string) (fs.FileInfo, error) { return fs.Stat(f.files, strings.TrimPrefix(p, "/")) },
		ReadFile: func(p string) ([]byte, error) { return fs.ReadFile(f.files, strings.TrimPrefix(p, "/")) },
	}
}

func files(mountinfo string, extra ...string) fstest.MapFS {
	m := fstest.MapFS{"proc/self/mountinfo": {Data: []byte(mountinfo)}}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = &fstest.MapFile{Data: []byte(extra[i+1])}
	}
	return m
}

func booted(m fstest.MapFS) fstest.MapFS {
	m["run/systemd/system"] = &fstest.MapFile{Mode: fs.ModeDir | 0o755}
	return m
}

func TestCheckSaysWhichModesAHostCanRunAndWhyNot(t *testing.T) {
	controllers := "cpuset cpu io memory hugetlb pids rdma misc\n"
	for _, tc := range []struct {
		name    string
		host    fakeHost
		mode    string
		missing []string // substrings, one per expected reason; empty: supported
		cgroup  string
	}{
		{"nspawn on a systemd host with v1 controllers", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsHybrid))}, "nspawn", nil, "legacy"},
		{"nspawn on a systemd host with cgroup2 controllers", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsUnified, "sys/fs/cgroup/cgroup.controllers", controllers))}, "nspawn", nil, "unified"},
		{"nspawn without systemd as init", fakeHost{[]string{"systemd-nspawn"}, files(mountsHybrid)}, "nspawn", []string{"systemd is not the init system"}, "legacy"},
		{"nspawn without the binary", fakeHost{nil, booted(files(mountsHybrid))}, "nspawn", []string{"systemd-nspawn is not installed"}, "legacy"},
		{"nspawn with cgroup2 lacking memory", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsUnified, "sys/fs/cgroup/cgroup.controllers", "cpu pids\n"))}, "nspawn", []string{"cgroup2 lacks the memory controller"}, ""},
		{"nspawn with controllers split between v1 and v2", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsSplit))}, "nspawn", []string{"controllers split between v1 (cpu) and v2"}, ""},
		{"nspawn without any cgroup mount, no binary, no systemd", fakeHost{nil, files(mountsNone)}, "nspawn", []string{"systemd-nspawn is not installed", "systemd is not the init system", "no usable cgroup hierarchy"}, ""},
		{"container on a systemd host with v1 controllers", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsHybrid))}, "container", nil, "legacy"},
		{"container on a systemd host with cgroup2 controllers", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsUnified, "sys/fs/cgroup/cgroup.controllers", controllers))}, "container", nil, "unified"},
		// runc alone is not the runtime: the bundle is run by
		// systemd-nspawn's OCI runtime.
		{"container with runc but without systemd-nspawn", fakeHost{[]string{"runc"}, booted(files(mountsHybrid))}, "container", []string{"systemd-nspawn is not installed"}, "legacy"},
		{"container without systemd as init", fakeHost{[]string{"systemd-nspawn"}, files(mountsHybrid)}, "container", []string{"systemd is not the init system"}, "legacy"},
		{"none with systemd", fakeHost{nil, booted(files(mountsNone))}, "none", nil, ""},
		{"none without systemd", fakeHost{nil, files(mountsNone)}, "none", []string{"systemd is not the init system"}, ""},
		{"unknown mode", fakeHost{[]string{"systemd-nspawn"}, booted(files(mountsHybrid))}, "vm", []string{`unknown isolation mode "vm"`}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.host.host().Check(tc.mode)
			if len(s.Missing) != len(tc.missing) {
				t.Fatalf("missing = %q, want %d reasons like %q", s.Missing, len(tc.missing), tc.missing)
			}
			for i, want := range tc.missing {
				if !strings.Contains(s.Missing[i], want) {
					t.Errorf("reason %d = %q, want it to say %q", i, s.Missing[i], want)
				}
			}
			if (s.Err() == nil) != (len(tc.missing) == 0) || (s.Err() != nil && !errors.Is(s.Err(), ErrUnsupported)) {
				t.Errorf("Err() = %v", s.Err())
			}
			if s.Cgroup != tc.cgroup {
				t.Errorf("cgroup = %q, want %q", s.Cgroup, tc.cgroup)
			}
			if s.Experimental != (tc.mode == "container") {
				t.Errorf("experimental = %v for %s", s.Experimental, tc.mode)
			}
		})
	}
}

// The zero Host is the real host: on this machine it must answer for
// nspawn with the hierarchy the kernel really has, whatever that is.
func TestZeroHostReadsTheRealMountTable(t *testing.T) {
	if _, err := os.Stat("/proc/self/mountinfo"); err != nil {
		tiers.Skip(t, tiers.Unit, "no /proc/self/mountinfo: not Linux")
	}
	s := Host{}.Check("nspawn")
	data, _ := os.ReadFile("/proc/self/mountinfo")
	hasV1Memory := strings.Contains(string(data), " - cgroup cgroup ") && strings.Contains(string(data), ",memory")
	if hasV1Memory && s.Cgroup != "legacy" {
		t.Errorf("host has v1 memory controller, Check says cgroup %q (missing %q)", s.Cgroup, s.Missing)
	}
	_, booted := os.Stat("/run/systemd/system")
	if (booted != nil) != slices.ContainsFunc(s.Missing, func(m string) bool { return strings.Contains(m, "init system") }) {
		t.Errorf("systemd-booted=%v but missing=%q", booted == nil, s.Missing)
	}
}

func TestUnescapeDecodesMountinfoOctal(t *testing.T) {
	if got := UnescapeMountinfo(`/mnt/with\040space`); got != "/mnt/with space" {
		t.Errorf("got %q", got)
	}
}
