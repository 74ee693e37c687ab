package upgrade

import (
	"fmt"
	"os/exec"
	"strings"
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

// An rpm's version is [epoch:]version-release. CompareVersions orders the
// forms the agent's packages have as rpm does; where rpm is on the
// machine, it is asked too (rpm.vercmp compares whole EVRs from 4.16 on).
func TestCompareVersionsOrdersRpmVersionsAsRpm(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"0.1.0~dev.5.gabc-1", "0.1.0-1", -1},
		{"0.1.0~dev.609.gfeea71ed-1", "0.1.0~dev.618.g1dbeef3d-1", -1},
		{"9.9.9~up1-1", "0.1.0~dev.618.g1dbeef3d-1", 1},
		{"9.9.9~up1-1", "9.9.9~up1-2", -1},
		{"9.9.9~up1-1", "9.9.9~up2-1", -1},
		{"1.2.0-1", "1.2.0-1", 0},
		{"1.2.0~rc.1-1", "1.2.0-1", -1},
		{"1.10-1", "1.9-1", 1},
		{"1:0.1-1", "2.0-1", 1},
		{"1.0a-1", "1.0-1", 1},
	}
	_, rpmErr := exec.LookPath("rpm")
	for _, tc := range cases {
		if got := CompareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if rpmErr != nil {
			continue
		}
		out, err := exec.Command("rpm", "--eval", `%{lua: print(rpm.vercmp("`+tc.a+`", "`+tc.b+`"))}`).Output()
		if err != nil {
			t.Fatalf("rpm --eval: %v", err)
		}
		if got := strings.TrimSpace(string(out)); got != fmt.Sprint(tc.want) {
			t.Errorf("rpm orders %q and %q as %s, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// A version asked for without a release (an rpm's) or revision (a
// Debian package's) is the package of that version whatever its
// release; one asked with it is that package only. A semver pre-release
// written with its hyphen is not taken for a version and a release.
func TestVersionIsIgnoresTheReleaseOnlyWhenNoneIsAsked(t *testing.T) {
	for _, tc := range []struct {
		pkg, asked string
		want       bool
	}{
		{"1.1.0", "1.1.0", true},
		{"1.1.0~rc.1", "1.1.0~rc.1", true},
		{"9.9.9~up1-1", "9.9.9~up1", true},
		{"9.9.9~up1-1", "9.9.9~up1-1", true},
		{"9.9.9~up1-2", "9.9.9~up1-1", false},
		{"9.9.9~up1-1", "9.9.9", false},
		{"9.9.9~up1-1", "9.9.9~up2", false},
		{"1:1.1.0-1", "1:1.1.0", true},
		{"1.1.0-1", "1:1.1.0", false},
		{"1.2.0-rc.1", "1.2.0", false},
		{"1.2.0~rc.1-1", "1.2.0-rc.1", false},
	} {
		if got := VersionIs(tc.pkg, tc.asked); got != tc.want {
			t.Errorf("VersionIs(%q, %q) = %v, want %v", tc.pkg, tc.asked, got, tc.want)
		}
	}
}

// A package's version is the executable's stamp in Debian's form and in
// rpm's (with its release); a semver pre-release's hyphen is no release.
func TestSameVersionKnowsDebianAndRpmForms(t *testing.T) {
	for _, tc := range []struct {
		pkg, stamp string
		want       bool
	}{
		{"1.2.0", "1.2.0", true},
		{"1.2.0~rc.1", "1.2.0-rc.1", true},
		{"1.2.0-rc.1", "1.2.0-rc.1", true},
		{"1.2.0~rc.1-1", "1.2.0-rc.1", true},
		{"1.2.0-1", "1.2.0", true},
		{"0.1.0~dev.645.ge876584a-1", "0.1.0-dev.645.ge876584a", true},
		{"1.2.0~rc.1-1", "1.2.0", false},
		{"1.2.0-rc.1", "1.2.0", false},
		{"1.2.1-1", "1.2.0", false},
	} {
		if got := SameVersion(tc.pkg, tc.stamp); got != tc.want {
			t.Errorf("SameVersion(%q, %q) = %v, want %v", tc.pkg, tc.stamp, got, tc.want)
		}
	}
}
