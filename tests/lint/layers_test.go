package lint

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// layers is the order of the project's packages, lowest first, as
// ARCHITECTURE section 3 describes them: small packages with one job at
// the bottom (names, paths, records), the modes and the cluster client
// in the middle, the concerns above them, the commands on top. A package
// imports only packages of lower layers (so there is no cycle, and no
// arrow up), and lib never imports cmd. A new package is put in a layer
// here; test support (a package ending in "test") may import tests/.
var layers = [][]string{
	// Leaves: names, paths, file and protocol helpers.
	{"lib/api/identity", "lib/api/manifests", "lib/api/v1alpha3", "lib/backoff", "lib/crashpoint", "lib/hostpaths", "lib/logging",
		"lib/regfile", "lib/regfile/regfiletest", "lib/sdstatus", "lib/unitjournal", "lib/unitnames", "lib/version"},
	// The service manager over D-Bus: above the unit names, for the
	// name of the transient unit it starts (unitnames.HostReboot).
	{"lib/units"},
	// The one table of the modes' facts (over the unit names).
	{"lib/modes/facts"},
	// State files: atomic writes, verified records, journals, the lock.
	{"lib/state", "lib/units/unitstest"},
	// The cluster side's image, written atomically (make images).
	{"lib/ociimage"},
	// What the state means: exit codes, host preparation, the small
	// records (the one outcome record), the generator's decision, the one runner of journaled
	// steps.
	{"lib/exitcode", "lib/hostprep", "lib/noderecord", "lib/outcome", "lib/owed", "lib/request", "lib/fence/record", "lib/generator", "lib/steps",
		"lib/devices"},
	{"lib/privilege", "lib/modes/softreboot", "lib/readiness", "lib/modes/nspawn/machinefile"},
	// The container mode's bundle on the host (unbounded-restart
	// refreshes its devices).
	{"lib/modes/container/bundle"},
	// Configuration, and what every command shares.
	{"lib/config", "lib/concern", "lib/concern/small"},
	// The adoption of an older agent's host, and the cluster client, the
	// artifacts, the mode interface, the reprovision handoff (its
	// reset and bootstrap are given to it by cmd/reprovision).
	{"lib/adopt", "lib/artifacts", "lib/kube", "lib/modes", "lib/reprovision",
		// The cluster side's rules for the hosts' certificate requests.
		"lib/csrapproval"},
	// The cluster side's rollout rules (over the cluster client).
	{"lib/upgrade", "lib/rollout"},
	{"lib/modes/nodestack", "lib/modes/bluegreen", "lib/modes/modestest", "lib/fence", "lib/report", "lib/health", "lib/lifecycle", "lib/kube/clustertest", "lib/status",
		"lib/fleet", "lib/controller"},
	// The blue/green modes' slot tree (the node's rootfs both nspawn
	// and container build, over nodestack), and its tests' images.
	{"lib/modes/bluegreen/tree", "lib/modes/bluegreen/tree/treetest"},
	// The modes, and the concerns that need no installation (an image
	// builder's prepare among them: the slot tree's host-independent
	// part, baked into an image).
	{"lib/modes/none", "lib/modes/nspawn", "lib/restart", "lib/daemon", "lib/recovery", "lib/cli",
		"lib/kubectlplugin", "lib/prepare"},
	// The container mode, above the other modes as ARCHITECTURE section 3
	// has it; it builds its rootfs with lib/modes/bluegreen/tree, as the
	// nspawn mode its machine, and imports no other mode.
	{"lib/modes/container"},
	// The table of the modes this build carries.
	{"lib/modes/all"},
	// The installations.
	{"lib/bootstrap"},
	// The one-shot concerns' scratch host (lib/testhost, built on
	// bootstrap's seams) sits beside the operations built on
	// bootstrap, never above them: bootstrap's own tests use it.
	{"lib/reset", "lib/repave", "lib/testhost"},
	// The isolation change, carried out by the repave's steps, and the
	// fakes of the tests of both.
	{"lib/isolation", "lib/repave/repavetest"},
	// The commands: one per concern, the CLI, the generator.
	{"cmd/bootstrap", "cmd/daemon", "cmd/fence", "cmd/health", "cmd/lifecycle", "cmd/recover", "cmd/repave", "cmd/reset", "cmd/isolation", "cmd/reprovision",
		"cmd/restart", "cmd/unbounded", "generators/unbounded-generator", "cmd/kubectl-unbounded", "cmd/upgrade",
		"cmd/prepare", "cmd/unbounded-controller", "cmd/mkimage"},
	// The multicall executable dispatches to the concerns' commands.
	{"cmd/unbounded-agent"},
}

func TestPackagesImportOnlyLowerLayers(t *testing.T) {
	goBin(t)
	const module = "unbounded-cloud.io/agent/"
	layer := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			if _, dup := layer[p]; dup {
				t.Errorf("%s is in two layers", p)
			}
			layer[p] = i
		}
	}
	out, stderr, err := command(repo, nil, "go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./lib/...", "./cmd/...", "./generators/...")
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	var problems []string
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		seen[pkg] = true
		li, ok := layer[pkg]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is in no layer: add it to tests/lint/layers_test.go where it belongs", pkg))
			continue
		}
		for _, imp := range f[1:] {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			if strings.HasPrefix(dep, "tests/") {
				if !strings.HasSuffix(pkg, "test") {
					problems = append(problems, fmt.Sprintf("%s imports %s: only test support may import tests/", pkg, dep))
				}
				continue
			}
			if strings.HasPrefix(pkg, "lib/") && strings.HasPrefix(dep, "cmd/") {
				problems = append(problems, fmt.Sprintf("%s imports %s: lib never imports a command", pkg, dep))
				continue
			}
			ld, ok := layer[dep]
			if !ok {
				continue // reported as its own line
			}
			if ld >= li {
				problems = append(problems, fmt.Sprintf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", pkg, li, dep, ld))
			}
		}
	}
	for p := range layer {
		if !seen[p] {
			problems = append(problems, fmt.Sprintf("%s is listed in a layer but is no package: remove it", p))
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}
