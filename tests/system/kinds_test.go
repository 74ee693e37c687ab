package system_test

import (
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// TestStateFileThatIsNotARegularFileBootsIntoSafeStateWithoutStallingPID1
// is the reviewer's finding under real systemd: a FIFO as the ownership
// record, an applied config that is a symlink to /dev/zero. systemd runs
// the generator synchronously at boot and at daemon-reload; one that
// blocks is killed at systemd's generator timeout and leaves no output.
// So the recovery link, present after the boot and again after a
// daemon-reload (systemd empties the output directory before each run),
// shows that the generator returned both times, with one kmsg line each.
func TestStateFileThatIsNotARegularFileBootsIntoSafeStateWithoutStallingPID1(t *testing.T) {
	defer scenario(t)()
	for _, tc := range []struct {
		name string
		file func(p hostpaths.Paths) string
		kind regfiletest.Kind
		says string
	}{
		{"ownership record is a FIFO", hostpaths.Paths.Ownership, regfiletest.FIFO, "ownership record unreadable"},
		{"applied config is a symlink to /dev/zero",
			func(p hostpaths.Paths) string { return p.AppliedConfig("kube2") }, regfiletest.DevZero, "applied state not trusted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer scenario(t)()
			m := harness.New(t, harness.Options{Package: true})
			writeValidConfig(t, m)
			writeApplied(t, m, "kube2", "nspawn")
			file := tc.file(hostpaths.New(m.Root()))
			regfiletest.Make(t, file, tc.kind)
			m.Start()

			hostFile := tc.file(hostpaths.New(""))
			check := func(when string, lines int) {
				t.Helper()
				wantGenerated(t, m, map[string][]string{
					"multi-user.target.wants/unbounded-recover@generator.service": link("unbounded-recover@.service"),
				})
				wantNoNodeUnits(t, m)
				k := generatorKmsg(m)
				if len(k) != lines {
					t.Fatalf("%s: generator kmsg lines = %q; want %d", when, k, lines)
				}
				last := k[len(k)-1]
				for _, w := range []string{tc.says, hostFile, tc.kind.Describes()} {
					if !strings.Contains(last, w) {
						t.Errorf("%s: generator kmsg %q does not contain %q", when, last, w)
					}
				}
			}
			check("at boot", 1)
			if out, err := m.Systemctl("daemon-reload"); err != nil {
				t.Fatalf("daemon-reload: %v\n%s", err, out)
			}
			check("after daemon-reload", 2)
		})
	}
}
