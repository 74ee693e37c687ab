package generator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// linkSet renders a plan's links as "path -> target" lines, sorted.
func linkSet(p Plan) []string {
	var s []string
	for _, l := range p.Links {
		s = append(s, l.Path+" -> "+l.Target)
	}
	sort.Strings(s)
	return s
}

// fence is what Read finds on a host with the package installed.
const fence = "/usr/lib/systemd/system/" + unitnames.Fence

// installed is what Read finds for the supervising units of mode on a host
// with the package (and systemd-container) installed: each unit's
// template, or the unit itself, in the package directory.
func installed(mode string) []string {
	var files []string
	for _, u := range facts.Supervising(mode, "kube1") {
		files = append(files, "/usr/lib/systemd/system/"+template(u))
	}
	return files
}

func TestDecideFollowsTheContractRulesInOrder(t *testing.T) {
	nspawn2 := &state.AppliedConfig{Slot: "kube2", Mode: "nspawn"}
	corrupt := errors.New("checksum mismatch")
	const u = "/usr/lib/systemd/system/"
	recoverOnly := []string{"multi-user.target.wants/unbounded-recover@generator.service -> " + u + "unbounded-recover@.service"}
	for _, tc := range []struct {
		name     string
		in       Input
		links    []string
		dropIns  []string
		problem  string
		noIssues bool
	}{
		{name: "fresh host without config writes nothing", in: Input{}},
		{name: "fresh host with config pulls in bootstrap", in: Input{ConfigExists: true},
			links: []string{"multi-user.target.wants/unbounded-bootstrap.service -> " + u + "unbounded-bootstrap.service"}},
		{name: "the older agent's host with a config pulls in the daemon (lifecycle adopts its node first), never bootstrap",
			in:    Input{ConfigExists: true, Legacy: []string{"/etc/unbounded/agent/kube1-applied-config.json"}},
			links: []string{"multi-user.target.wants/unbounded-daemon.service -> " + u + "unbounded-daemon.service"}},
		{name: "the older agent's host without a config stays the older agent's",
			in: Input{Legacy: []string{"/etc/unbounded/agent/kube1-applied-config.json"}}},
		{name: "config that cannot be stat'ed starts nothing and reports", in: Input{ConfigErr: fs.ErrPermission},
			problem: "cannot tell whether the config exists"},
		{name: "a live reprovision handoff wins over ownership, an applied config and a config file: its unit alone runs",
			in:    Input{Handoff: true, Ownership: &state.Ownership{Owner: "bootstrap", Unit: unitnames.Bootstrap}, Active: nspawn2, ConfigExists: true, FenceUnit: fence, NodeUnits: installed("nspawn")},
			links: []string{"multi-user.target.wants/unbounded-reprovision.service -> " + u + "unbounded-reprovision.service"}},
		{name: "a handoff journal that cannot be trusted starts nothing of the node and pulls in recovery",
			in: Input{HandoffErr: corrupt, ConfigExists: true}, links: recoverOnly, problem: "reprovision handoff journal not trusted"},
		{name: "ownership wins over an applied config and a config file",
			in:    Input{Ownership: &state.Ownership{Owner: "reprovision", Unit: "unbounded-reprovision.service"}, Active: nspawn2, ConfigExists: true, FenceUnit: fence, NodeUnits: installed("nspawn")},
			links: []string{"multi-user.target.wants/unbounded-reprovision.service -> " + u + "unbounded-reprovision.service"}},
		{name: "the agent's upgrade owns the host: it is resumed and the node starts as usual, the daemon is the upgrade's to start",
			in: Input{Ownership: &state.Ownership{Owner: state.OwnerUpgrade, Unit: unitnames.Upgrade}, Active: nspawn2, ConfigExists: true, FenceUnit: fence, NodeUnits: installed("nspawn")},
			links: []string{
				"multi-user.target.wants/unbounded-node.target -> " + u + "unbounded-node.target",
				"multi-user.target.wants/unbounded-upgrade.service -> " + u + "unbounded-upgrade.service",
				"unbounded-mode-nspawn.target.requires/systemd-nspawn@kube2.service -> " + u + "systemd-nspawn@.service",
				"unbounded-node.target.requires/unbounded-mode-nspawn.target -> " + u + "unbounded-mode-nspawn.target",
			},
			dropIns: []string{"systemd-nspawn@kube2.service.d/50-unbounded-fence.conf"}},
		{name: "an upgrade owner naming another unit is an installation like any other",
			in:    Input{Ownership: &state.Ownership{Owner: state.OwnerUpgrade, Unit: "unbounded-repave.service"}, Active: nspawn2, FenceUnit: fence, NodeUnits: installed("nspawn")},
			links: []string{"multi-user.target.wants/unbounded-repave.service -> " + u + "unbounded-repave.service"}},
		{name: "ownership of a template instance links the template",
			in:    Input{Ownership: &state.Ownership{Owner: "reset", Unit: "unbounded-reset@keep.service"}},
			links: []string{"multi-user.target.wants/unbounded-reset@keep.service -> " + u + "unbounded-reset@.service"}},
		{name: "ownership without unit starts nothing", in: Input{Ownership: &state.Ownership{Owner: "bootstrap"}}},
		{name: "ownership naming a foreign unit is not resumed",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "sshd.service"}}, problem: `"sshd.service"`},
		{name: "ownership naming the daemon does not start it",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-daemon.service"}}, problem: "part of the node or the daemon"},
		{name: "ownership naming a node unit does not start it",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-container@kube9.service"}}, problem: "part of the node or the daemon"},
		{name: "ownership naming a target is not resumed",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-node.target"}}, problem: "not an unbounded-* service"},
		{name: "ownership naming a path is not resumed",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-../../etc/x.service"}}, problem: "not an unbounded-* service"},
		{name: "unreadable ownership record fails closed and pulls in recovery",
			in:    Input{Ownership: &state.Ownership{Owner: "unknown"}, OwnershipErr: state.ErrCorrupt, Active: nspawn2, FenceUnit: fence, NodeUnits: installed("nspawn")},
			links: recoverOnly, problem: "ownership record unreadable, host treated as owned, node and daemon not started, recovery pulled in"},
		{name: "corrupt applied state pulls in recovery only",
			in:      Input{ActiveErr: corrupt, ConfigExists: true},
			links:   recoverOnly,
			problem: "checksum mismatch"},
		{name: "nspawn kube2: multi-user wants node target and daemon, node target requires mode target requires the fenced machine",
			in: Input{Active: nspawn2, ConfigExists: true, FenceUnit: fence, NodeUnits: installed("nspawn")},
			links: []string{
				"multi-user.target.wants/unbounded-daemon.service -> " + u + "unbounded-daemon.service",
				"multi-user.target.wants/unbounded-node.target -> " + u + "unbounded-node.target",
				"unbounded-mode-nspawn.target.requires/systemd-nspawn@kube2.service -> " + u + "systemd-nspawn@.service",
				"unbounded-node.target.requires/unbounded-mode-nspawn.target -> " + u + "unbounded-mode-nspawn.target",
			},
			dropIns: []string{"systemd-nspawn@kube2.service.d/50-unbounded-fence.conf"}},
		{name: "container kube1 requires the slot's container",
			in: Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "container"}, FenceUnit: "/etc/systemd/system/" + unitnames.Fence, NodeUnits: installed("container")},
			links: []string{
				"multi-user.target.wants/unbounded-daemon.service -> " + u + "unbounded-daemon.service",
				"multi-user.target.wants/unbounded-node.target -> " + u + "unbounded-node.target",
				"unbounded-mode-container.target.requires/unbounded-container@kube1.service -> " + u + "unbounded-container@.service",
				"unbounded-node.target.requires/unbounded-mode-container.target -> " + u + "unbounded-mode-container.target",
			},
			dropIns: []string{"unbounded-container@kube1.service.d/50-unbounded-fence.conf"}},
		{name: "none mode requires and fences both runtime units",
			in: Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "none"}, FenceUnit: fence, NodeUnits: installed("none")},
			links: []string{
				"multi-user.target.wants/unbounded-daemon.service -> " + u + "unbounded-daemon.service",
				"multi-user.target.wants/unbounded-node.target -> " + u + "unbounded-node.target",
				"unbounded-mode-none.target.requires/unbounded-containerd.service -> " + u + "unbounded-containerd.service",
				"unbounded-mode-none.target.requires/unbounded-kubelet.service -> " + u + "unbounded-kubelet.service",
				"unbounded-node.target.requires/unbounded-mode-none.target -> " + u + "unbounded-mode-none.target",
			},
			dropIns: []string{"unbounded-containerd.service.d/50-unbounded-fence.conf", "unbounded-kubelet.service.d/50-unbounded-fence.conf"}},
		{name: "trusted record without a fence unit starts no node and no daemon and pulls in recovery",
			in:      Input{Active: nspawn2, ConfigExists: true, FenceErr: fmt.Errorf("%w: not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system", ErrFenceMissing), NodeUnits: installed("nspawn")},
			links:   recoverOnly,
			problem: "unfenced, node and daemon not started, recovery pulled in: no usable unbounded-fence.service: not in /etc/systemd/system"},
		{name: "an Input that never looked for the fence fails closed",
			in:      Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "none"}, NodeUnits: installed("none")},
			links:   recoverOnly,
			problem: "no usable unbounded-fence.service"},
		{name: "nspawn without systemd-nspawn@.service starts no node and no daemon and pulls in recovery",
			in: Input{Active: nspawn2, ConfigExists: true, FenceUnit: fence,
				NodeUnitsErr: fmt.Errorf("%w: systemd-nspawn@kube2.service (nor systemd-nspawn@.service) not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system", ErrNodeUnitMissing)},
			links:   recoverOnly,
			problem: "mode nspawn would report the node up with nothing running, node and daemon not started, recovery pulled in: no usable node unit: systemd-nspawn@kube2.service (nor systemd-nspawn@.service) not in"},
		{name: "none with one of its two units found is not enough",
			in:      Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "none"}, FenceUnit: fence, NodeUnits: installed("none")[:1]},
			links:   recoverOnly,
			problem: "mode none would report the node up with nothing running"},
		{name: "an Input that never looked for the node units fails closed",
			in:      Input{Active: &state.AppliedConfig{Slot: "kube2", Mode: "container"}, FenceUnit: fence},
			links:   recoverOnly,
			problem: "no usable node unit: unbounded-container@kube2.service not looked for"},
		{name: "fence and node unit both missing are one problem naming both",
			in:      Input{Active: nspawn2, FenceErr: ErrFenceMissing, NodeUnitsErr: fmt.Errorf("%w: systemd-nspawn@kube2.service: masked by /etc/systemd/system/systemd-nspawn@kube2.service", ErrNodeUnitMissing)},
			links:   recoverOnly,
			problem: "unfenced, node and daemon not started, recovery pulled in: no usable unbounded-fence.service; and mode nspawn would report the node up with nothing running, node and daemon not started, recovery pulled in: no usable node unit: systemd-nspawn@kube2.service: masked by"},
		{name: "a missing fence does not matter on a fresh host",
			in:    Input{ConfigExists: true, FenceErr: ErrFenceMissing},
			links: []string{"multi-user.target.wants/unbounded-bootstrap.service -> " + u + "unbounded-bootstrap.service"}},
		{name: "a mode lib/state should have rejected still pulls in recovery",
			in:      Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "vm"}, FenceUnit: fence, NodeUnits: []string{"/usr/lib/systemd/system/vm.service"}},
			links:   recoverOnly,
			problem: `mode "vm"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Decide(tc.in)
			if got := linkSet(p); !reflect.DeepEqual(got, tc.links) && (len(got) != 0 || len(tc.links) != 0) {
				t.Errorf("links:\n got %q\nwant %q", got, tc.links)
			}
			var files []string
			for _, f := range p.Files {
				files = append(files, f.Path)
				if !strings.HasSuffix(f.Content, "[Unit]\nRequires=unbounded-fence.service\nAfter=unbounded-fence.service\n") {
					t.Errorf("drop-in %s content %q", f.Path, f.Content)
				}
			}
			sort.Strings(files)
			if !reflect.DeepEqual(files, tc.dropIns) && (len(files) != 0 || len(tc.dropIns) != 0) {
				t.Errorf("drop-ins: got %q want %q", files, tc.dropIns)
			}
			if (p.Problem == "") != (tc.problem == "") || !strings.Contains(p.Problem, tc.problem) {
				t.Errorf("problem %q, want one containing %q", p.Problem, tc.problem)
			}
		})
	}
}

func TestReadStopsAtOwnershipAndAtActiveState(t *testing.T) {
	var calls []string
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { calls = append(calls, "own"); return nil, nil },
		ReadActive: func(hostpaths.Paths) (*state.AppliedConfig, error) {
			calls = append(calls, "active")
			return &state.AppliedConfig{Slot: "kube1", Mode: "none"}, nil
		},
		Stat: func(p string) (fs.FileInfo, error) { calls = append(calls, "stat "+p); return nil, fs.ErrNotExist },
	}
	in := h.Read(hostpaths.New("/x"))
	want := []string{"own", "active",
		"stat /x/etc/systemd/system/unbounded-fence.service",
		"stat /x/run/systemd/system/unbounded-fence.service",
		"stat /x/usr/lib/systemd/system/unbounded-fence.service",
		"stat /x/etc/systemd/system/unbounded-containerd.service",
		"stat /x/run/systemd/system/unbounded-containerd.service",
		"stat /x/usr/lib/systemd/system/unbounded-containerd.service",
		"stat /x/etc/systemd/system/unbounded-kubelet.service",
		"stat /x/run/systemd/system/unbounded-kubelet.service",
		"stat /x/usr/lib/systemd/system/unbounded-kubelet.service"}
	if in.Active == nil || !reflect.DeepEqual(calls, want) {
		t.Fatalf("input %+v, calls %q, want %q: on a bootstrapped host the fence and the node units are looked for, the config is not", in, calls, want)
	}
	if in.NodeUnits != nil || !errors.Is(in.NodeUnitsErr, ErrNodeUnitMissing) {
		t.Fatalf("node units %q, %v; want missing", in.NodeUnits, in.NodeUnitsErr)
	}
	if in.FenceUnit != "" || !errors.Is(in.FenceErr, ErrFenceMissing) {
		t.Fatalf("fence %q, %v; want missing", in.FenceUnit, in.FenceErr)
	}

	calls = nil
	h.ReadActive = func(hostpaths.Paths) (*state.AppliedConfig, error) {
		calls = append(calls, "active")
		return nil, state.ErrCorrupt
	}
	if in := h.Read(hostpaths.New("/x")); !reflect.DeepEqual(calls, []string{"own", "active"}) || in.FenceErr != nil || in.NodeUnitsErr != nil {
		t.Fatalf("corrupt state: calls %q, input %+v; nothing else matters, not even the fence", calls, in)
	}

	// A host without this agent's record: the older agent's records are
	// looked for (two stats), then the config.
	calls = nil
	h.ReadActive = func(hostpaths.Paths) (*state.AppliedConfig, error) { calls = append(calls, "active"); return nil, nil }
	h.Stat = func(p string) (fs.FileInfo, error) {
		calls = append(calls, "stat "+p)
		if strings.HasSuffix(p, "kube2-applied-config.json") || strings.HasSuffix(p, "agent.toml") {
			return nil, nil
		}
		return nil, fs.ErrNotExist
	}
	in = h.Read(hostpaths.New("/x"))
	want = []string{"own", "active", "stat /x/etc/unbounded/agent/kube1-applied-config.json", "stat /x/etc/unbounded/agent/kube2-applied-config.json", "stat /x/etc/unbounded/agent.toml"}
	if !reflect.DeepEqual(calls, want) || !reflect.DeepEqual(in.Legacy, []string{"/etc/unbounded/agent/kube2-applied-config.json"}) || !in.ConfigExists {
		t.Fatalf("calls %q, input %+v; want %q and the older record found", calls, in, want)
	}
}

// TestReadFindsTheFenceWhereSystemdWouldLoadItFrom lays out the unit
// search directories under a real root, as a host can have them.
func TestReadFindsTheFenceWhereSystemdWouldLoadItFrom(t *testing.T) {
	const unitFile = "[Unit]\nDescription=fence\n[Service]\nType=oneshot\nExecStart=/bin/true\n"
	etc, run, usr := "/etc/systemd/system/"+unitnames.Fence, "/run/systemd/system/"+unitnames.Fence, "/usr/lib/systemd/system/"+unitnames.Fence
	for _, tc := range []struct {
		name  string
		setup func(p hostpaths.Paths)
		found string // host path, "" for missing
		err   string
	}{
		{name: "shipped by the package", setup: func(p hostpaths.Paths) { writeUnder(t, p, usr, unitFile) }, found: usr},
		{name: "the operator's copy wins", setup: func(p hostpaths.Paths) {
			writeUnder(t, p, usr, unitFile)
			writeUnder(t, p, etc, unitFile)
		}, found: etc},
		{name: "a runtime unit counts", setup: func(p hostpaths.Paths) { writeUnder(t, p, run, unitFile) }, found: run},
		{name: "missing everywhere", setup: func(p hostpaths.Paths) {
			// Its drop-in directory alone is not a unit.
			os.MkdirAll(p.Join(etc+".d"), 0o755)
		}, err: "no usable unbounded-fence.service: not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system"},
		{name: "masked by a link to /dev/null over the shipped unit", setup: func(p hostpaths.Paths) {
			writeUnder(t, p, usr, unitFile)
			os.MkdirAll(filepath.Dir(p.Join(etc)), 0o755)
			if err := os.Symlink("/dev/null", p.Join(etc)); err != nil {
				t.Fatal(err)
			}
		}, err: "masked by " + etc},
		{name: "masked by an empty file", setup: func(p hostpaths.Paths) {
			writeUnder(t, p, usr, unitFile)
			writeUnder(t, p, run, "")
		}, err: "masked by " + run},
		{name: "a directory is not a unit file", setup: func(p hostpaths.Paths) {
			os.MkdirAll(p.Join(usr), 0o755)
		}, err: usr + " is a d"},
		{name: "a dangling link is missing", setup: func(p hostpaths.Paths) {
			os.MkdirAll(filepath.Dir(p.Join(etc)), 0o755)
			os.Symlink(p.Join("/nowhere"), p.Join(etc))
		}, err: "not in /etc/systemd/system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			tc.setup(p)
			h := Host{ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
				ReadActive: func(hostpaths.Paths) (*state.AppliedConfig, error) {
					return &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}, nil
				}}
			in := h.Read(p)
			if got := p.Rel(in.FenceUnit); in.FenceUnit != "" && got != tc.found || (in.FenceUnit == "") != (tc.found == "") {
				t.Errorf("fence unit %q, want %q", in.FenceUnit, tc.found)
			}
			if tc.err == "" {
				if in.FenceErr != nil {
					t.Errorf("fence error %v", in.FenceErr)
				}
				return
			}
			if !errors.Is(in.FenceErr, ErrFenceMissing) || !strings.Contains(strings.ReplaceAll(in.FenceErr.Error(), p.Root, ""), tc.err) {
				t.Errorf("fence error %v, want ErrFenceMissing saying %q", in.FenceErr, tc.err)
			}
		})
	}
}

func writeUnder(t *testing.T, p hostpaths.Paths, hostPath, content string) {
	t.Helper()
	f := p.Join(hostPath)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReadFindsTheNodeUnitsAsSystemdWouldLoadThem lays out the supervising
// units under a real root, with the fence installed, and runs the read and
// the decision: a node is planned exactly when every supervising unit of
// the active mode would load, and otherwise the one problem names what is
// missing and the mode.
func TestReadFindsTheNodeUnitsAsSystemdWouldLoadThem(t *testing.T) {
	const unitFile = "[Service]\nExecStart=/bin/true\n"
	const etc, run, usr = "/etc/systemd/system/", "/run/systemd/system/", "/usr/lib/systemd/system/"
	mask := func(p hostpaths.Paths, hostPath string) {
		os.MkdirAll(filepath.Dir(p.Join(hostPath)), 0o755)
		if err := os.Symlink("/dev/null", p.Join(hostPath)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, mode string
		setup      func(p hostpaths.Paths)
		found      []string // host paths; nil for the safe state
		problem    string
	}{
		{name: "nspawn with systemd-container's template", mode: "nspawn",
			setup: func(p hostpaths.Paths) { writeUnder(t, p, usr+"systemd-nspawn@.service", unitFile) },
			found: []string{usr + "systemd-nspawn@.service"}},
		{name: "nspawn without systemd-nspawn@.service", mode: "nspawn",
			setup:   func(p hostpaths.Paths) {},
			problem: "mode nspawn would report the node up with nothing running, node and daemon not started, recovery pulled in: no usable node unit: systemd-nspawn@kube2.service (nor systemd-nspawn@.service) not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system"},
		{name: "an instance file without its template is enough", mode: "nspawn",
			setup: func(p hostpaths.Paths) { writeUnder(t, p, etc+"systemd-nspawn@kube2.service", unitFile) },
			found: []string{etc + "systemd-nspawn@kube2.service"}},
		{name: "an instance file in the package directory wins over the operator's template", mode: "container",
			setup: func(p hostpaths.Paths) {
				writeUnder(t, p, etc+"unbounded-container@.service", unitFile)
				writeUnder(t, p, usr+"unbounded-container@kube2.service", unitFile)
			},
			found: []string{usr + "unbounded-container@kube2.service"}},
		{name: "the other slot's instance file does not count", mode: "nspawn",
			setup:   func(p hostpaths.Paths) { writeUnder(t, p, usr+"systemd-nspawn@kube1.service", unitFile) },
			problem: "systemd-nspawn@kube2.service (nor systemd-nspawn@.service) not in"},
		{name: "a masked instance over an installed template", mode: "nspawn",
			setup: func(p hostpaths.Paths) {
				writeUnder(t, p, usr+"systemd-nspawn@.service", unitFile)
				mask(p, etc+"systemd-nspawn@kube2.service")
			},
			problem: "no usable node unit: systemd-nspawn@kube2.service: masked by /etc/systemd/system/systemd-nspawn@kube2.service"},
		{name: "a masked template masks the instance", mode: "container",
			setup: func(p hostpaths.Paths) {
				writeUnder(t, p, usr+"unbounded-container@.service", unitFile)
				writeUnder(t, p, run+"unbounded-container@.service", "")
			},
			problem: "mode container would report the node up with nothing running, node and daemon not started, recovery pulled in: no usable node unit: unbounded-container@kube2.service: masked by /run/systemd/system/unbounded-container@.service"},
		{name: "none with both units", mode: "none",
			setup: func(p hostpaths.Paths) {
				writeUnder(t, p, usr+"unbounded-containerd.service", unitFile)
				writeUnder(t, p, run+"unbounded-kubelet.service", unitFile)
			},
			found: []string{usr + "unbounded-containerd.service", run + "unbounded-kubelet.service"}},
		{name: "none without the kubelet unit", mode: "none",
			setup:   func(p hostpaths.Paths) { writeUnder(t, p, usr+"unbounded-containerd.service", unitFile) },
			problem: "mode none would report the node up with nothing running, node and daemon not started, recovery pulled in: no usable node unit: unbounded-kubelet.service not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system"},
		{name: "none without either unit names both once", mode: "none",
			setup:   func(p hostpaths.Paths) {},
			problem: "no usable node unit: unbounded-containerd.service, unbounded-kubelet.service not in /etc/systemd/system"},
		{name: "none with a masked kubelet and no containerd names both", mode: "none",
			setup: func(p hostpaths.Paths) {
				writeUnder(t, p, usr+"unbounded-kubelet.service", unitFile)
				mask(p, etc+"unbounded-kubelet.service")
			},
			problem: "no usable node unit: unbounded-containerd.service not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system; unbounded-kubelet.service: masked by /etc/systemd/system/unbounded-kubelet.service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			writeUnder(t, p, fence, "[Service]\nType=oneshot\nExecStart=/bin/true\n")
			tc.setup(p)
			h := Host{ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
				ReadActive: func(hostpaths.Paths) (*state.AppliedConfig, error) {
					return &state.AppliedConfig{Slot: "kube2", Mode: tc.mode}, nil
				}}
			in := h.Read(p)
			var found []string
			for _, f := range in.NodeUnits {
				found = append(found, p.Rel(f))
			}
			if !reflect.DeepEqual(found, tc.found) {
				t.Errorf("node units %q, want %q (error %v)", found, tc.found, in.NodeUnitsErr)
			}
			plan := Decide(in)
			problem := strings.ReplaceAll(plan.Problem, p.Root, "")
			if tc.found != nil {
				if problem != "" || len(plan.Files) != len(tc.found) {
					t.Errorf("plan %+v, want the node", plan)
				}
				return
			}
			if !errors.Is(in.NodeUnitsErr, ErrNodeUnitMissing) {
				t.Errorf("error %v, want ErrNodeUnitMissing", in.NodeUnitsErr)
			}
			if !strings.Contains(problem, tc.problem) || strings.Contains(problem, unitnames.Fence) {
				t.Errorf("problem %q, want one containing %q (and the fence is installed)", problem, tc.problem)
			}
			if got := linkSet(plan); len(plan.Files) != 0 || len(got) != 1 || !strings.Contains(got[0], unitnames.RecoverGenerator) {
				t.Errorf("plan %q %+v, want recovery only", got, plan.Files)
			}
		})
	}
}

func TestReadTreatsAFenceStatErrorAsNoFence(t *testing.T) {
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
		ReadActive: func(hostpaths.Paths) (*state.AppliedConfig, error) {
			return &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}, nil
		},
		Stat: func(p string) (fs.FileInfo, error) {
			return nil, &fs.PathError{Op: "stat", Path: p, Err: syscall.EIO}
		},
	}
	in := h.Read(hostpaths.New("/x"))
	if in.FenceUnit != "" || !errors.Is(in.FenceErr, ErrFenceMissing) || !strings.Contains(in.FenceErr.Error(), "/x/etc/systemd/system/unbounded-fence.service: input/output error") {
		t.Fatalf("fence %q, %v; an unreadable fence is no fence", in.FenceUnit, in.FenceErr)
	}
	if p := Decide(in); len(p.Files) != 0 || !strings.Contains(p.Problem, "input/output error") {
		t.Fatalf("plan %+v", p)
	}
}

func TestReadTreatsStatErrorOtherThanNotExistAsConfigError(t *testing.T) {
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
		ReadActive:    func(hostpaths.Paths) (*state.AppliedConfig, error) { return nil, nil },
		Stat:          func(string) (fs.FileInfo, error) { return nil, fs.ErrPermission },
	}
	if in := h.Read(hostpaths.New("/x")); in.ConfigExists || !errors.Is(in.ConfigErr, fs.ErrPermission) {
		t.Fatalf("got %+v", in)
	}
	h.Stat = func(string) (fs.FileInfo, error) { return nil, fs.ErrNotExist }
	if in := h.Read(hostpaths.New("/x")); in.ConfigExists || in.ConfigErr != nil {
		t.Fatalf("missing config: got %+v", in)
	}
}

type bufCloser struct {
	bytes.Buffer
	closeErr error
}

func (b *bufCloser) Close() error { return b.closeErr }

func TestReportWritesOneEscapedLineWithHostPathsToKmsg(t *testing.T) {
	var kmsg bufCloser
	var opened string
	h := Host{OpenKmsg: func(path string) (io.WriteCloser, error) { opened = path; return &kmsg, nil }}
	h.Report(hostpaths.New("/tmp/r"), "bad /tmp/r/var/lib/unbounded/kube1-applied-config.json: \x00\nx")
	if opened != "/tmp/r/dev/kmsg" {
		t.Errorf("opened %s", opened)
	}
	want := "<3>unbounded-generator: bad /var/lib/unbounded/kube1-applied-config.json: \\x00\\x0ax\n"
	if kmsg.String() != want {
		t.Errorf("got %q\nwant %q", kmsg.String(), want)
	}
}

func TestReportTruncatesToOneKmsgRecord(t *testing.T) {
	var kmsg bufCloser
	h := Host{OpenKmsg: func(string) (io.WriteCloser, error) { return &kmsg, nil }}
	h.Report(hostpaths.New(""), strings.Repeat("x", 5000))
	if n := len(kmsg.String()); n > 1000 || strings.Count(kmsg.String(), "\n") != 1 {
		t.Fatalf("line of %d bytes, %d newlines", n, strings.Count(kmsg.String(), "\n"))
	}
}

func TestReportFallsBackToStderrWhenKmsgCannotBeOpenedOrWritten(t *testing.T) {
	for name, open := range map[string]func(string) (io.WriteCloser, error){
		"open fails":  func(string) (io.WriteCloser, error) { return nil, fs.ErrNotExist },
		"close fails": func(string) (io.WriteCloser, error) { return &bufCloser{closeErr: fs.ErrClosed}, nil },
	} {
		var stderr bytes.Buffer
		Host{OpenKmsg: open, Stderr: &stderr}.Report(hostpaths.New(""), "boom")
		if stderr.String() != "unbounded-generator: boom\n" {
			t.Errorf("%s: stderr %q", name, stderr.String())
		}
	}
}

func TestRunTurnsAPanicIntoAReport(t *testing.T) {
	var kmsg bufCloser
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { panic("seam exploded") },
		OpenKmsg:      func(string) (io.WriteCloser, error) { return &kmsg, nil },
	}
	h.Run(hostpaths.New(t.TempDir()), t.TempDir())
	if !strings.Contains(kmsg.String(), "internal error: seam exploded") {
		t.Fatalf("kmsg %q", kmsg.String())
	}
}

func TestRunReportsUnwritableOutput(t *testing.T) {
	var kmsg bufCloser
	out := filepath.Join(t.TempDir(), "file")
	os.WriteFile(out, nil, 0o644) // the output "directory" is a file
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
		ReadActive:    func(hostpaths.Paths) (*state.AppliedConfig, error) { return nil, nil },
		Stat:          func(string) (fs.FileInfo, error) { return nil, nil },
		OpenKmsg:      func(string) (io.WriteCloser, error) { return &kmsg, nil },
	}
	h.Run(hostpaths.New(t.TempDir()), out)
	if !strings.Contains(kmsg.String(), "cannot write generator output") {
		t.Fatalf("kmsg %q", kmsg.String())
	}
}

// tree lists dir as "path -> target" for links and "path: content" for files.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var s []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			s = append(s, rel+" -> "+target)
		} else {
			data, _ := os.ReadFile(path)
			s = append(s, rel+": "+string(data))
		}
		return nil
	})
	sort.Strings(s)
	return s
}

func planTree(p Plan) []string {
	s := linkSet(p)
	for _, f := range p.Files {
		s = append(s, f.Path+": "+f.Content)
	}
	sort.Strings(s)
	return s
}

func TestWriteIsIdempotentAndConvergesAfterAStateChange(t *testing.T) {
	dir := t.TempDir()
	// Another generator's output shares multi-user.target.wants and a .d
	// directory: it must survive.
	os.MkdirAll(filepath.Join(dir, "multi-user.target.wants"), 0o755)
	os.Symlink("/usr/lib/systemd/system/other.service", filepath.Join(dir, "multi-user.target.wants/other.service"))
	os.MkdirAll(filepath.Join(dir, "systemd-nspawn@kube1.service.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "systemd-nspawn@kube1.service.d/10-other.conf"), []byte("x"), 0o644)
	others := []string{"multi-user.target.wants/other.service -> /usr/lib/systemd/system/other.service", "systemd-nspawn@kube1.service.d/10-other.conf: x"}

	steps := []Input{
		{Active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}, FenceUnit: fence, NodeUnits: installed("nspawn")},
		{Active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}, FenceUnit: fence, NodeUnits: installed("nspawn")},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "none"}, FenceUnit: fence, NodeUnits: installed("none")},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "none"}, FenceErr: ErrFenceMissing, NodeUnits: installed("none")},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "none"}, FenceUnit: fence, NodeUnits: installed("none")},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "none"}, FenceUnit: fence, NodeUnitsErr: ErrNodeUnitMissing},
		{ActiveErr: state.ErrCorrupt},
		{ConfigExists: true},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "container"}, FenceUnit: fence, NodeUnits: installed("container")},
		{},
	}
	for i, in := range steps {
		p := Decide(in)
		if err := Write(dir, p); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want := append(planTree(p), others...)
		sort.Strings(want)
		if got := tree(t, dir); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (%+v):\n got %q\nwant %q", i, in, got, want)
		}
	}
}

func TestWriteReplacesAStaleLinkAndDropIn(t *testing.T) {
	dir := t.TempDir()
	p := Decide(Input{Active: &state.AppliedConfig{Slot: "kube2", Mode: "nspawn"}, FenceUnit: fence, NodeUnits: installed("nspawn")})
	os.MkdirAll(filepath.Join(dir, "unbounded-node.target.requires"), 0o755)
	os.Symlink("/wrong", filepath.Join(dir, "unbounded-node.target.requires/unbounded-mode-nspawn.target"))
	os.MkdirAll(filepath.Join(dir, "systemd-nspawn@kube2.service.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "systemd-nspawn@kube2.service.d", FenceDropIn), []byte("old"), 0o644)
	if err := Write(dir, p); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, dir), planTree(p); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// TestWriteRemovesWantsLinksOfAnOlderGenerator: the generator once linked
// its targets with .wants; a rerun over such output (no reboot, no
// systemd emptying the directory) must not leave a Wants= path to a node
// unit beside the Requires= one.
func TestWriteRemovesWantsLinksOfAnOlderGenerator(t *testing.T) {
	dir := t.TempDir()
	for _, l := range []string{
		"unbounded-node.target.wants/unbounded-mode-nspawn.target",
		"unbounded-mode-nspawn.target.wants/systemd-nspawn@kube1.service",
		"unbounded-mode-none.target.wants/unbounded-kubelet.service",
	} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(l)), 0o755)
		os.Symlink("/usr/lib/systemd/system/x", filepath.Join(dir, l))
	}
	p := Decide(Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}, FenceUnit: fence, NodeUnits: installed("nspawn")})
	if err := Write(dir, p); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, dir), planTree(p); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	for _, d := range []string{"unbounded-node.target.wants", "unbounded-mode-nspawn.target.wants", "unbounded-mode-none.target.wants"} {
		if _, err := os.Lstat(filepath.Join(dir, d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left behind (%v)", d, err)
		}
	}
}

func TestValidUnitName(t *testing.T) {
	for name, want := range map[string]bool{
		"unbounded-bootstrap.service":         true,
		"unbounded-reset@keep.service":        true,
		"unbounded-x.target":                  false,
		"unbounded-x.socket":                  false,
		"unbounded-a/b.service":               false,
		"unbounded-..service":                 false,
		"unbounded-a@b@c.service":             false,
		"unbounded-a b.service":               false,
		strings.Repeat("a", 250) + ".service": false,
	} {
		if got := validUnitName(name); got != want {
			t.Errorf("validUnitName(%q) = %v, want %v", name, got, want)
		}
	}
}

// Explain says, for every kind of state, the action the plan carries out.
func TestExplainNamesTheActionOfThePlan(t *testing.T) {
	root := hostpaths.New("/tmp/r")
	nspawn2 := &state.AppliedConfig{Slot: "kube2", Mode: "nspawn"}
	for _, tc := range []struct {
		name   string
		in     Input
		action string
		units  []string
		reason string
	}{
		{"fresh host without config", Input{}, ActionNothing, nil, "no /etc/unbounded/agent.toml; the package stays idle"},
		{"fresh host with config", Input{ConfigExists: true}, ActionBootstrap, []string{unitnames.Bootstrap}, "bootstrap: /etc/unbounded/agent.toml is in place"},
		{"the older agent's host with config", Input{ConfigExists: true, Legacy: []string{"/etc/unbounded/agent/kube2-applied-config.json"}}, ActionAdopt, []string{unitnames.Daemon},
			"adopt the older agent's node (/etc/unbounded/agent/kube2-applied-config.json): unbounded-lifecycle.service adopts it"},
		{"the older agent's host without config", Input{Legacy: []string{"/etc/unbounded/agent/kube1-applied-config.json"}}, ActionNothing, nil,
			"stays the older agent's until /etc/unbounded/agent.toml is in place"},
		{"config not stat'able", Input{ConfigErr: fmt.Errorf("stat /tmp/r/etc/unbounded/agent.toml: %w", fs.ErrPermission)}, ActionNothing, nil,
			"nothing starts: cannot tell whether the config exists, bootstrap not started: stat /etc/unbounded/agent.toml: permission denied"},
		{"bootstrapped", Input{Active: nspawn2, FenceUnit: fence, NodeUnits: installed("nspawn")}, ActionStartNode,
			[]string{unitnames.NodeTarget, unitnames.Daemon}, "start the node: mode nspawn in slot kube2"},
		{"corrupt", Input{ActiveErr: errors.New("checksum mismatch")}, ActionSafeState, []string{unitnames.RecoverGenerator}, "safe state: applied state not trusted"},
		{"no fence", Input{Active: nspawn2, NodeUnits: installed("nspawn")}, ActionSafeState, []string{unitnames.RecoverGenerator}, "node would start unfenced"},
		{"reprovision handoff", Input{Handoff: true, ConfigExists: true}, ActionResume, []string{unitnames.Reprovision}, "a reprovision handoff is in progress"},
		{"owned, resumed", Input{Ownership: &state.Ownership{Owner: "reprovision", Unit: "unbounded-reprovision.service"}}, ActionResume,
			[]string{"unbounded-reprovision.service"}, `the installation "reprovision" owns the host: unbounded-reprovision.service is resumed`},
		{"owned, no unit", Input{Ownership: &state.Ownership{Owner: "bootstrap"}}, ActionNothing, nil, `"bootstrap" owns the host and names no unit`},
		{"owned, unreadable", Input{Ownership: &state.Ownership{Owner: "unknown"}, OwnershipErr: state.ErrCorrupt}, ActionSafeState, []string{unitnames.RecoverGenerator}, "safe state: ownership record unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nb := Explain(root, tc.in, Decide(tc.in))
			units := nb.Units
			if len(units) == 0 {
				units = nil
			}
			sort.Strings(units)
			want := slices.Clone(tc.units)
			sort.Strings(want)
			if nb.Action != tc.action || !reflect.DeepEqual(units, want) || !strings.Contains(nb.Reason, tc.reason) {
				t.Errorf("got %+v, want action %s units %v reason containing %q", nb, tc.action, want, tc.reason)
			}
			if strings.Contains(nb.Reason, "/tmp/r") {
				t.Errorf("reason shows the test root: %q", nb.Reason)
			}
		})
	}
}
