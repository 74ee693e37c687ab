package upgrade

import (
	"os/exec"
	"testing"
)

// Ordered as dpkg orders them; where dpkg is on the machine, it is asked
// too.
func TestCompareVersionsOrdersAsDpkg(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"1.0", "1.0", 0},
		{"1.0", "1.1", -1},
		{"1.10", "1.9", 1},
		{"1.2.0~rc.1", "1.2.0", -1},
		{"1.2.0~rc.1", "1.2.0~rc.2", -1},
		{"0.1.0~dev.609.gfeea71ed", "0.1.0~dev.618.g1dbeef3d", -1},
		{"0.1.0~dev.618.g1dbeef3d", "0.1.0", -1},
		{"9.9.9~up1", "0.1.0~dev.618.g1dbeef3d", 1},
		{"1:0.1", "2.0", 1},
		{"1.0-1", "1.0-2", -1},
		{"1.0a", "1.0", 1},
		{"1.0+b1", "1.0", 1},
		{"1.001", "1.1", 0},
	} {
		if got := CompareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := CompareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
		if _, err := exec.LookPath("dpkg"); err == nil {
			op := map[int]string{-1: "lt", 0: "eq", 1: "gt"}[tc.want]
			if err := exec.Command("dpkg", "--compare-versions", tc.a, op, tc.b).Run(); err != nil {
				t.Errorf("dpkg says %q is not %s %q", tc.a, op, tc.b)
			}
		}
	}
}
