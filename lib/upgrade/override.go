package upgrade

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// On an image-based host (/usr read-only, the agent baked into the image)
// nothing is installed into /usr: the new package's one-shots are staged
// under /var/lib/unbounded/agent/<version>/libexec, and a drop-in for each
// agent unit that runs one binds that directory over /usr/libexec/unbounded
// (BindReadOnlyPaths=), so the units' command lines, and any drop-in of the
// operator's that changes them, stay as they are (ARCHITECTURE section 4).
// A newer image supersedes the override (Supersede, run by lifecycle at
// boot). What the override does not reach: the generator (run by systemd
// itself, not by a unit), the operator CLI /usr/bin/unbounded, and unit
// files the new version adds or changes.

// OverrideDropIn is the drop-in's name in /etc/systemd/system/<unit>.d.
const OverrideDropIn = "50-unbounded-agent-override.conf"

// stagedLibexec is where version's one-shots are staged (a path on the
// host, as units name it).
func stagedLibexec(p hostpaths.Paths, version string) string {
	return filepath.Join(p.AgentDir(), safeName(version), "libexec")
}

// usrReadOnly says whether /usr is mounted read-only (statfs ST_RDONLY).
func usrReadOnly(p hostpaths.Paths) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(p.Join("/usr"), &st); err != nil {
		return false
	}
	return st.Flags&unix.ST_RDONLY != 0
}

// debArch is this executable's architecture as Debian names it.
func debArch() string {
	switch runtime.GOARCH {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	}
	return runtime.GOARCH
}

// overriddenUnits are the package's units that run one of its one-shots:
// every unbounded-* unit in /usr/lib/systemd/system whose file names
// /usr/libexec/unbounded/.
func overriddenUnits(p hostpaths.Paths) ([]string, error) {
	dir := p.Join("/usr/lib/systemd/system")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var units []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, "unbounded-") || !strings.HasSuffix(n, ".service") || !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(data), hostpaths.LibexecDirHost+"/") {
			units = append(units, n)
		}
	}
	slices.Sort(units)
	return units, nil
}

// dropInContent is unit's drop-in that binds dir over the image's
// one-shots. Every unit but lifecycle itself is ordered after lifecycle:
// at boot lifecycle may supersede the override, removing the staged
// directory before its daemon-reload, and a unit set up in between would
// bind a directory that is gone and fail before its program runs (the
// fence did: the node's start failed with it, after an image update).
func dropInContent(unit, version, dir string) string {
	order := ""
	if unit != unitnames.Lifecycle {
		order = fmt.Sprintf(`[Unit]
# The override's directory is settled (kept, or superseded by a newer
# image) before this unit is set up.
After=%s
`, unitnames.Lifecycle)
	}
	return fmt.Sprintf(`# Written by unbounded-upgrade on this image-based host (/usr read-only):
# the unit runs the staged agent %s in place of the image's. A newer
# image removes it at boot (unbounded-lifecycle.service); so does reset.
%s[Service]
BindReadOnlyPaths=%s:%s
`, version, order, dir, hostpaths.LibexecDirHost)
}

// writeOverride stages the package's one-shots for version and points the
// units at them: the staged directory first (a temporary name, synced,
// renamed), then the drop-ins, then the record.
func writeOverride(p hostpaths.Paths, pkg, version string, now time.Time) (*state.AgentOverride, error) {
	units, err := overriddenUnits(p)
	if err != nil {
		return nil, err
	}
	if len(units) == 0 {
		return nil, errors.New("no unit of the agent runs a one-shot from " + hostpaths.LibexecDirHost)
	}
	dir := stagedLibexec(p, version)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, err
	}
	if _, err := extractDir(pkg, hostpaths.LibexecDirHost, tmp); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(tmp, "unbounded-agent")); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("%s has no %s/unbounded-agent", pkg, hostpaths.LibexecDirHost)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	o := &state.AgentOverride{Version: version, Dir: p.Rel(dir), Units: units, At: now.UTC()}
	if err := pointUnits(p, o); err != nil {
		return nil, err
	}
	return o, nil
}

// pointUnits writes o's drop-ins and record (o nil: removes every
// drop-in and the record, the units run the image's agent again).
func pointUnits(p hostpaths.Paths, o *state.AgentOverride) error {
	old, _ := state.ReadAgentOverride(p)
	var keep []string
	if o != nil {
		keep = o.Units
		for _, u := range o.Units {
			d := p.UnitDropInDir(u)
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			if err := state.WriteFileAtomic(filepath.Join(d, OverrideDropIn), []byte(dropInContent(u, o.Version, o.Dir)), 0o644); err != nil {
				return err
			}
		}
		data, _ := json.Marshal(o)
		if err := state.WriteFileAtomic(p.AgentOverride(), append(data, '\n'), 0o600); err != nil {
			return err
		}
	}
	if old != nil {
		for _, u := range old.Units {
			if slices.Contains(keep, u) {
				continue
			}
			removeDropIn(p, u)
		}
	}
	if o == nil {
		if units, err := overriddenUnits(p); err == nil {
			for _, u := range units {
				removeDropIn(p, u)
			}
		}
		if err := state.RemoveDurable(p.AgentOverride()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func removeDropIn(p hostpaths.Paths, unit string) {
	d := p.UnitDropInDir(unit)
	os.Remove(filepath.Join(d, OverrideDropIn))
	os.Remove(d) // only when empty: an operator's drop-ins stay
}

// pruneStaged removes the staged versions but keep ("" keeps none).
func pruneStaged(p hostpaths.Paths, keep string) {
	ents, _ := os.ReadDir(p.AgentDir())
	for _, e := range ents {
		if e.IsDir() && (keep == "" || e.Name() != safeName(keep)) {
			os.RemoveAll(filepath.Join(p.AgentDir(), e.Name()))
		}
	}
}

// DebVersion is the Debian form of a version stamp (nfpm writes a semver
// pre-release "1.2.0-rc.1" as "1.2.0~rc.1").
func DebVersion(stamp string) string { return strings.Replace(stamp, "-", "~", 1) }

// Supersede removes the override when the image's agent (image, its
// version stamp) is as new as the override's or newer: a newer image was
// booted, and the units run its agent again. It says whether it removed
// one; the caller reloads the service manager.
func Supersede(p hostpaths.Paths, image string) (*state.AgentOverride, error) {
	o, err := state.ReadAgentOverride(p)
	if err != nil || o == nil {
		return nil, err
	}
	if CompareVersions(DebVersion(image), o.Version) < 0 {
		return nil, nil
	}
	if err := pointUnits(p, nil); err != nil {
		return nil, err
	}
	pruneStaged(p, "")
	return o, nil
}

// RemoveOverride takes the override away (reset): the drop-ins in
// /etc/systemd/system, the record and the staged agents.
func RemoveOverride(p hostpaths.Paths) error {
	if err := pointUnits(p, nil); err != nil {
		return err
	}
	pruneStaged(p, "")
	return nil
}
