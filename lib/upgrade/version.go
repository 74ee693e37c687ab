package upgrade

import (
	"strconv"
	"strings"
)

// CompareVersions orders two Debian package versions
// ([epoch:]upstream[-revision]) as dpkg does (deb-version(7)): -1, 0 or
// 1. "~" sorts before everything, even the end: 1.2.0~rc.1 < 1.2.0.
//
// An rpm's [epoch:]version-release splits the same way, and rpm (4.10
// and later) orders it alike for the versions the agent's packages have
// (digits and letters in runs, ".", "~", a release): it orders them so
// too. Where the two differ, between separators (rpm takes "+" and "."
// for the same, dpkg sorts "+" first) and for "^", this is dpkg's order.
func CompareVersions(a, b string) int {
	ea, ua, ra := splitVersion(a)
	eb, ub, rb := splitVersion(b)
	if ea != eb {
		if ea < eb {
			return -1
		}
		return 1
	}
	if c := verrevcmp(ua, ub); c != 0 {
		return c
	}
	return verrevcmp(ra, rb)
}

func splitVersion(v string) (epoch int, upstream, revision string) {
	if e, rest, ok := strings.Cut(v, ":"); ok {
		if n, err := strconv.Atoi(e); err == nil {
			epoch, v = n, rest
		}
	}
	if i := strings.LastIndex(v, "-"); i >= 0 {
		return epoch, v[:i], v[i+1:]
	}
	return epoch, v, ""
}

// order is dpkg's weight of one character of a non-digit run.
func order(s string, i int) int {
	if i >= len(s) {
		return 0
	}
	c := s[i]
	switch {
	case c >= '0' && c <= '9':
		return 0
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		return int(c)
	case c == '~':
		return -1
	}
	return int(c) + 256
}

func isDigit(s string, i int) bool { return i < len(s) && s[i] >= '0' && s[i] <= '9' }

func verrevcmp(a, b string) int {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		for (i < len(a) && !isDigit(a, i)) || (j < len(b) && !isDigit(b, j)) {
			ac, bc := order(a, i), order(b, j)
			if ac != bc {
				return sign(ac - bc)
			}
			i, j = i+1, j+1
		}
		for i < len(a) && a[i] == '0' {
			i++
		}
		for j < len(b) && b[j] == '0' {
			j++
		}
		first := 0
		for isDigit(a, i) && isDigit(b, j) {
			if first == 0 {
				first = int(a[i]) - int(b[j])
			}
			i, j = i+1, j+1
		}
		if isDigit(a, i) {
			return 1
		}
		if isDigit(b, j) {
			return -1
		}
		if first != 0 {
			return sign(first)
		}
	}
	return 0
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

// VersionIs says whether a package's version pkg is the version asked
// for: the same, or asked names no release (rpm) or revision (Debian)
// and pkg is asked with one ("9.9.9~up1" asks for the rpm of version
// 9.9.9~up1-1): the release is the packaging's, the version the agent's.
func VersionIs(pkg, asked string) bool {
	if pkg == asked {
		return true
	}
	v, rel := splitRelease(pkg)
	_, askedRel := splitRelease(asked)
	return rel != "" && askedRel == "" && v == asked
}

// splitRelease splits a package version into the agent's version and the
// package's release (rpm) or revision (Debian), "" when it has none:
// "9.9.9~up1-1" is "9.9.9~up1" and "1". A release starts with a digit
// (as rpm's and Debian's conventions have it, and nfpm writes "1"),
// which keeps a semver pre-release written with its hyphen ("1.2.0-rc.1",
// not a package version) from being taken for one.
func splitRelease(v string) (version, release string) {
	i := strings.LastIndex(v, "-")
	if i <= 0 || i == len(v)-1 || !isDigit(v, i+1) {
		return v, ""
	}
	return v[:i], v[i+1:]
}

// validVersion accepts what deb-version(7) allows, which also keeps a
// version usable as a file and directory name (it starts with a digit:
// never "." or "..", and no "/").
func validVersion(v string) bool {
	if v == "" || len(v) > 128 || v[0] < '0' || v[0] > '9' {
		return false
	}
	for _, c := range v {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case strings.ContainsRune(".+~:-", c):
		default:
			return false
		}
	}
	return true
}
