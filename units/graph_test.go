package units_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/generator"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"

	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/tests/tiers"
)

// docPrefixes are the accepted Documentation= forms; the project's own
// pages are https://unbounded-cloud.io/docs/agent/units/<unit>.
var docPrefixes = []string{"https://unbounded-cloud.io/docs/agent", "man:", "file:/usr/share/doc/unbounded-agent/"}

const recoverTemplate = "unbounded-recover@.service"

// graphRule is one property of the unit graph (ARCHITECTURE section 6).
// Rules are matched by name against whatever units exist, so that a rule
// (every agent service's OnFailure=, the fence's type) applies to a unit
// the moment it lands in units/, one ARCHITECTURE lists and units/ does
// not hold yet included.
type graphRule struct {
	name    string
	applies func(unit string) bool
	check   func(t *testing.T, u *parsed)
}

func isNamed(names ...string) func(string) bool {
	return func(u string) bool { return slices.Contains(names, u) }
}

func requireAll(t *testing.T, u *parsed, section, key string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !u.has(section, key, w) {
			t.Errorf("%s: [%s] %s= lacks %s (has %q)", u.name, section, key, w, u.values(section, key))
		}
	}
}

func modeTargets() []string {
	var s []string
	for _, m := range facts.Names() {
		s = append(s, unitnames.ModeTarget(m))
	}
	return s
}

var graphRules = []graphRule{
	{
		name:    "every unit has a Description= and a Documentation= of the project's style",
		applies: func(string) bool { return true },
		check: func(t *testing.T, u *parsed) {
			if d := u.values("Unit", "Description"); len(d) == 0 {
				t.Errorf("%s: no Description=", u.name)
			}
			docs := u.values("Unit", "Documentation")
			if len(docs) == 0 {
				t.Errorf("%s: no Documentation=", u.name)
			}
			for _, d := range docs {
				ok := false
				for _, p := range docPrefixes {
					ok = ok || strings.HasPrefix(d, p)
				}
				if !ok {
					t.Errorf("%s: Documentation=%s is not one of %q", u.name, d, docPrefixes)
				}
			}
		},
	},
	{
		name: "every agent service starts recovery when it fails",
		applies: func(n string) bool {
			return strings.HasPrefix(n, "unbounded-") && strings.HasSuffix(n, ".service") && n != recoverTemplate
		},
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "OnFailure", "unbounded-recover@%n.service")
		},
	},
	{
		name:    "recovery does not recover itself (a failing recovery would loop)",
		applies: isNamed(recoverTemplate),
		check: func(t *testing.T, u *parsed) {
			if v := u.values("Unit", "OnFailure"); len(v) > 0 {
				t.Errorf("%s: OnFailure=%q", u.name, v)
			}
		},
	},
	{
		name:    "the node target is reached after the mode targets and after bootstrap",
		applies: isNamed(unitnames.NodeTarget),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", append(modeTargets(), unitnames.Bootstrap)...)
		},
	},
	{
		name:    "a mode target is reached after the supervising units the generator makes it require, for both slots",
		applies: isNamed(modeTargets()...),
		check: func(t *testing.T, u *parsed) {
			mode := strings.TrimSuffix(strings.TrimPrefix(u.name, "unbounded-mode-"), ".target")
			for _, slot := range hostpaths.Slots {
				requireAll(t, u, "Unit", "After", facts.Supervising(mode, slot)...)
			}
		},
	},
	{
		name:    "the generator's targets are never enabled (only the generator pulls them in)",
		applies: isNamed(append(modeTargets(), unitnames.NodeTarget)...),
		check: func(t *testing.T, u *parsed) {
			if u.hasSection("Install") {
				t.Errorf("%s has an [Install] section: enabling it would start a node the generator held back", u.name)
			}
		},
	},
	{
		name:    "bootstrap does not wait for the node target (the node target waits for it)",
		applies: isNamed(unitnames.Bootstrap),
		check: func(t *testing.T, u *parsed) {
			for _, k := range []string{"After", "Requires", "BindsTo"} {
				if u.has("Unit", k, unitnames.NodeTarget) {
					t.Errorf("%s: %s=%s makes an ordering cycle with unbounded-node.target", u.name, k, unitnames.NodeTarget)
				}
			}
		},
	},
	{
		name:    "lifecycle runs before the daemon, which pulls it in (a repave is never started over a half-done one)",
		applies: isNamed(unitnames.Daemon),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "Wants", "unbounded-lifecycle.service")
			requireAll(t, u, "Unit", "After", "unbounded-lifecycle.service")
		},
	},
	{
		name:    "repave and isolation change run after lifecycle and after the node target's start, and are no part of the node target (they stop the old node and start the target themselves)",
		applies: isNamed("unbounded-repave.service", unitnames.Isolation),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", "unbounded-lifecycle.service", unitnames.NodeTarget)
			for _, k := range []string{"Requires", "BindsTo", "PartOf", "Requisite"} {
				if u.has("Unit", k, unitnames.NodeTarget) {
					t.Errorf("%s: %s=%s: stopping the old node would stop the repave", u.name, k, unitnames.NodeTarget)
				}
			}
		},
	},
	{
		name:    "the fence is a oneshot without RemainAfterExit, so every node start runs it again",
		applies: isNamed(unitnames.Fence),
		check: func(t *testing.T, u *parsed) {
			if ty := u.values("Service", "Type"); !slices.Equal(ty, []string{"oneshot"}) {
				t.Errorf("%s: Type=%q, want oneshot", u.name, ty)
			}
			if r := u.values("Service", "RemainAfterExit"); len(r) > 0 && r[len(r)-1] != "no" && r[len(r)-1] != "false" {
				t.Errorf("%s: RemainAfterExit=%q: a started fence would never run again", u.name, r)
			}
		},
	},
	{
		name:    "restart waits for an installation of the same transaction (first boot, repave, lifecycle): it does not restart a node being built or replaced",
		applies: isNamed(restartService),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", unitnames.Bootstrap, "unbounded-repave.service", "unbounded-lifecycle.service")
			noOrderingOn(t, u, "Before", unitnames.Bootstrap, "unbounded-repave.service", "unbounded-lifecycle.service")
		},
	},
	{
		name:    "restart, health's service and recovery are never enabled (only their starters start them)",
		applies: isNamed(restartService, healthService, recoverTemplate),
		check: func(t *testing.T, u *parsed) {
			if u.hasSection("Install") {
				t.Errorf("%s has an [Install] section: %q", u.name, u.values("Install", "WantedBy"))
			}
		},
	},
	{
		name:    "health judges the node after its start was tried (node target, first boot, daemon) and before boot-complete.target",
		applies: isNamed(healthService),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", unitnames.NodeTarget, unitnames.Bootstrap, "unbounded-daemon.service")
			requireAll(t, u, "Unit", "Before", bootComplete)
			noOrderingOn(t, u, "After", bootComplete)
			// Health starts the restart and the node target itself: an
			// ordering on the restart would make its own start job wait
			// for, or cycle with, the restart it starts.
			noOrderingOn(t, u, "Before", unitnames.NodeTarget, restartService)
		},
	},
	{
		name:    "the health timer is pulled in with the node target (so a refused or unanswered fence is retried) and runs the check with accuracy finer than its interval",
		applies: isNamed(healthTimer),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Install", "WantedBy", unitnames.NodeTarget)
			if v := u.values("Timer", "Unit"); len(v) > 0 && v[len(v)-1] != healthService {
				t.Errorf("%s: Unit=%q, want %s", u.name, v, healthService)
			}
			for _, k := range []string{"OnBootSec", "OnUnitInactiveSec"} {
				if len(u.values("Timer", k)) == 0 {
					t.Errorf("%s: no %s=", u.name, k)
				}
			}
			every := lastDuration(t, u, "Timer", "OnUnitInactiveSec")
			if acc := lastDuration(t, u, "Timer", "AccuracySec"); acc == 0 || acc >= every {
				t.Errorf("%s: AccuracySec=%s is not finer than OnUnitInactiveSec=%s (systemd's default is 1 min)", u.name, acc, every)
			}
		},
	},
	{
		name:    "recovery needs the host root (its rate limit's history and the lock) and waits for no network (the generator's instance runs early at boot)",
		applies: isNamed(recoverTemplate),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "RequiresMountsFor", hostpaths.HostRootHost)
			noOrderingOn(t, u, "After", "network-online.target", "network.target")
			noOrderingOn(t, u, "Wants", "network-online.target")
			noOrderingOn(t, u, "Requires", "network-online.target")
		},
	},
	{
		name:    "a reset started again waits for the recovery of its last failure (which writes under the host root the reset removes)",
		applies: isNamed(unitnames.Reset),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", "unbounded-recover@"+unitnames.Reset+".service")
		},
	},
	{
		name:    "an isolation change started again waits for the recovery of its last failure",
		applies: isNamed(unitnames.Isolation),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", "unbounded-recover@"+unitnames.Isolation+".service")
		},
	},
	{
		name:    "the reprovision handoff waits for the recovery of the change that staged it and of its own last failure (their writes under the host root its reset removes)",
		applies: isNamed(unitnames.Reprovision),
		check: func(t *testing.T, u *parsed) {
			requireAll(t, u, "Unit", "After", "unbounded-recover@"+unitnames.Isolation+".service", "unbounded-recover@"+unitnames.Reprovision+".service")
		},
	},
}

const (
	restartService = "unbounded-restart.service"
	healthService  = "unbounded-health.service"
	healthTimer    = "unbounded-health.timer"
	bootComplete   = "boot-complete.target"
)

// noOrderingOn fails for each of units that u names in [Unit] key.
func noOrderingOn(t *testing.T, u *parsed, key string, units ...string) {
	t.Helper()
	for _, o := range units {
		if u.has("Unit", key, o) {
			t.Errorf("%s: %s=%s", u.name, key, o)
		}
	}
}

// lastDuration parses the last value of section.key as systemd's time
// span in its simple forms ("30s", "1min", "500ms", "2"); 0 when unset.
func lastDuration(t *testing.T, u *parsed, section, key string) time.Duration {
	t.Helper()
	v := u.values(section, key)
	if len(v) == 0 {
		return 0
	}
	s := strings.NewReplacer("min", "m", "sec", "s", "hour", "h").Replace(v[len(v)-1])
	if !strings.ContainsAny(s, "hms") {
		s += "s"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %s=%s: %v", u.name, key, v[len(v)-1], err)
	}
	return d
}

// The package's drop-in on boot-complete.target makes the boot's
// assessment wait for, and require, health's first check of the boot
// (greenboot's pattern): boot-complete.target merged with it requires and
// is ordered after unbounded-health.service, which is ordered before it,
// the same direction.
func TestBootCompleteRequiresAndFollowsHealth(t *testing.T) {
	dropIns, err := filepath.Glob(bootComplete + ".d/*.conf")
	if err != nil || len(dropIns) == 0 {
		t.Fatalf("no drop-in in %s.d/ (%v)", bootComplete, err)
	}
	// boot-complete.target itself is systemd's: the drop-in alone is what
	// the package adds to it.
	u := parseUnit(t, bootComplete, dropIns[0], dropIns[1:]...)
	requireAll(t, u, "Unit", "Requires", healthService)
	requireAll(t, u, "Unit", "After", healthService)
	noOrderingOn(t, u, "Before", healthService)
	h := parseUnit(t, healthService, healthService)
	if h.has("Unit", "After", bootComplete) {
		t.Errorf("%s is After=%s, which is After= it: an ordering cycle", healthService, bootComplete)
	}
}

// TestUnitGraph applies every rule to every shipped unit it names.
func TestUnitGraph(t *testing.T) {
	units := shippedUnits(t)
	for _, r := range graphRules {
		t.Run(r.name, func(t *testing.T) {
			n := 0
			for _, name := range units {
				if !r.applies(name) {
					continue
				}
				n++
				r.check(t, parseUnit(t, name, name))
			}
			if n == 0 {
				// Checked nothing: a skip, not a pass.
				t.Skip("no shipped unit yet: the rule applies as soon as one lands")
			}
		})
	}
}

// nodePlan is the generator's decision for a bootstrapped host in mode and
// slot with the package (and so the fence unit) and the mode's supervising
// units installed.
func nodePlan(t *testing.T, mode, slot string) generator.Plan {
	t.Helper()
	var nodeUnits []string
	for _, u := range facts.Supervising(mode, slot) {
		nodeUnits = append(nodeUnits, hostpaths.UnitDirHost+"/"+u)
	}
	plan := generator.Decide(generator.Input{
		Active:    &state.AppliedConfig{Slot: slot, Mode: mode},
		FenceUnit: hostpaths.UnitDirHost + "/" + unitnames.Fence,
		NodeUnits: nodeUnits,
	})
	if plan.Problem != "" || len(plan.Files) == 0 {
		t.Fatalf("mode %s slot %s: no node plan (%q)", mode, slot, plan.Problem)
	}
	return plan
}

// TestGeneratorLinksOnlyShippedTargets ties the generator to the unit
// files: every target it links exists in units/.
func TestGeneratorLinksOnlyShippedTargets(t *testing.T) {
	shipped := shippedUnits(t)
	for _, mode := range facts.Names() {
		n := 0
		for _, l := range nodePlan(t, mode, "kube1").Links {
			target := filepath.Base(l.Target)
			if !strings.HasSuffix(target, ".target") {
				continue
			}
			n++
			if !slices.Contains(shipped, target) {
				t.Errorf("mode %s: the generator links %s, which units/ does not ship", mode, target)
			}
		}
		if n != 2 {
			t.Errorf("mode %s: the generator links %d targets, want the node and the mode target", mode, n)
		}
	}
}

// TestEveryRequiresTheGeneratorAddsIsOrdered ties the generator's links to
// the unit files' orderings. A Requires= without After= starts both units
// at once: the requiring target would be reached whether or not the unit
// it requires comes up, and "unbounded-node.target is active" would mean
// nothing. So for every X.requires/Y the generator writes, for both slots
// of every mode, the shipped file of X says After=Y; and the chain from
// multi-user.target down is wants (node target, daemon), then requires.
func TestEveryRequiresTheGeneratorAddsIsOrdered(t *testing.T) {
	shipped := shippedUnits(t)
	for _, mode := range facts.Names() {
		for _, slot := range hostpaths.Slots {
			requires := 0
			for _, l := range nodePlan(t, mode, slot).Links {
				dir, unit := filepath.Split(l.Path)
				dir = strings.TrimSuffix(dir, "/")
				switch {
				case dir == "multi-user.target.wants":
					if unit != unitnames.NodeTarget && unit != unitnames.Daemon {
						t.Errorf("%s %s: multi-user.target wants %s", mode, slot, unit)
					}
					continue
				case strings.HasSuffix(dir, ".requires"):
					requires++
				default:
					t.Errorf("%s %s: %s is neither multi-user.target's want nor a requires link", mode, slot, l.Path)
					continue
				}
				x := strings.TrimSuffix(dir, ".requires")
				if !slices.Contains(shipped, x) {
					t.Errorf("%s %s: %s requires %s, but units/ does not ship %s", mode, slot, x, unit, x)
					continue
				}
				if u := parseUnit(t, x, x); !u.has("Unit", "After", unit) {
					t.Errorf("%s %s: the generator makes %s require %s, but %s has no After=%s (has %q)", mode, slot, x, unit, x, unit, u.values("Unit", "After"))
				}
			}
			if want := 1 + len(facts.Supervising(mode, slot)); requires != want {
				t.Errorf("%s %s: %d requires links, want %d (mode target, supervising units)", mode, slot, requires, want)
			}
		}
	}
}

// TestGeneratedFenceDropInMakesTheNodeUnitRequireTheFence combines the
// generator's real output for a bootstrapped nspawn host with the unit it
// applies to (the host's systemd-nspawn@.service): merged, the machine of
// the active slot Requires= and is After= the fence, and systemd itself
// loads the merged unit without complaint.
func TestGeneratedFenceDropInMakesTheNodeUnitRequireTheFence(t *testing.T) {
	tree := installTree(t, true)
	p := hostpaths.New(tree)
	template := filepath.Join(p.UnitDir(), "systemd-nspawn@.service")
	if _, err := os.Stat(template); err != nil {
		tiers.Skip(t, tiers.Lint, "systemd-nspawn@.service is not installed on this host (apt-get install systemd-container): %v", err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube2", Mode: "nspawn", AppliedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	generator.Host{}.Run(p, out)

	node := "systemd-nspawn@kube2.service"
	if _, err := os.Lstat(filepath.Join(out, "unbounded-mode-nspawn.target.requires", node)); err != nil {
		t.Fatalf("the generator did not make unbounded-mode-nspawn.target require %s: %v", node, err)
	}
	dropIns, _ := filepath.Glob(filepath.Join(out, node+".d", "*.conf"))
	if len(dropIns) != 1 {
		t.Fatalf("drop-ins for %s: %q, want the fence drop-in", node, dropIns)
	}
	merged := parseUnit(t, node, template, dropIns...)
	requireAll(t, merged, "Unit", "Requires", unitnames.Fence)
	requireAll(t, merged, "Unit", "After", unitnames.Fence)
	if len(merged.values("Service", "ExecStart")) == 0 {
		t.Errorf("the merged unit lost the template's ExecStart=")
	}
	// The chain above the machine, from the shipped unit files.
	requireAll(t, parseUnit(t, "unbounded-mode-nspawn.target", "unbounded-mode-nspawn.target"), "Unit", "After", node)
	requireAll(t, parseUnit(t, unitnames.NodeTarget, unitnames.NodeTarget), "Unit", "After", "unbounded-mode-nspawn.target")

	// systemd's loader on the same drop-in: /etc/systemd/system stands in
	// for /run/systemd/generator, which verify does not read under --root.
	if analyze, ok := lookSystemdAnalyze(); ok {
		etc := filepath.Join(tree, "etc/systemd/system", node+".d")
		copyFile(t, dropIns[0], filepath.Join(etc, filepath.Base(dropIns[0])), 0o644)
		inst := filepath.Join(p.UnitDir(), node)
		if err := os.Symlink("systemd-nspawn@.service", inst); err != nil {
			t.Fatal(err)
		}
		provideExecutables(t, tree, merged)
		verify(t, analyze, tree, node)
	} else {
		tiers.Skip(t, tiers.Lint, "systemd-analyze is missing: the merged unit was checked by the Go parser only")
	}
}
