package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/version"
)

// plan reads what to upgrade to: the daemon's request, else a package in
// the staging directory. A request already carried out (Taken), or none,
// and nothing staged, is ErrNothingToDo.
func (u *Upgrade) plan(ctx context.Context) (*Journal, error) {
	from, st, err := u.Packages.Installed(ctx, Package)
	if err != nil {
		return nil, err
	}
	j := &Journal{From: from.Version}
	if st == NotInstalled || u.imageBased() {
		// The agent came with the image: the running one's version.
		j.Image, j.From = true, version.Version
	}
	req, err := request.Read(u.Paths, Concern)
	switch {
	case err == nil && !request.Taken(u.Paths, Concern, req.UID):
		j.UID, j.OperationName, j.Generation = req.UID, req.Operation, outcome.GenerationOf(req.Parameters)
		j.To, j.Source, j.SHA256 = req.Parameters["version"], req.Parameters["url"], strings.ToLower(req.Parameters["sha256"])
		var missing []string
		for _, k := range []string{"version", "url", "sha256"} {
			if req.Parameters[k] == "" {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			return j, u.refuse(j, StepFetch, fmt.Errorf("the AgentUpgrade operation %s lacks the parameter(s) %s", req.Operation, strings.Join(missing, ", ")))
		}
		if !validSHA256(j.SHA256) {
			return j, u.refuse(j, StepFetch, fmt.Errorf("the AgentUpgrade operation %s: sha256 %q is not 64 hex digits", req.Operation, j.SHA256))
		}
		if !validVersion(j.To) {
			return j, u.refuse(j, StepFetch, fmt.Errorf("the AgentUpgrade operation %s: version %q is not a package version (a digit, then letters, digits and .+~:-)", req.Operation, j.To))
		}
		j.Staged = filepath.Join(u.Paths.UpgradeStaged(), Package+"_"+safeName(j.To)+"."+u.Packages.Format())
		return j, u.refuseUnsupported(j, StepFetch)
	case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, request.ErrCorrupt):
		return nil, err
	}
	staged, sum, err := findStaged(u.Paths)
	if err != nil && staged != "" {
		// A .sha256 that says no sum: refused like a wrong one, its
		// files moved out (the path unit must not start this again).
		j.Source, j.Staged = staged, staged
		return j, u.refuse(j, StepVerify, err)
	}
	if err != nil {
		return nil, err
	}
	if staged == "" {
		return nil, ErrNothingToDo
	}
	j.Source, j.Staged, j.SHA256 = staged, staged, sum
	j.Done = append(j.Done, StepFetch) // it is where fetch would put it
	return j, u.refuseUnsupported(j, StepVerify)
}

// refuseUnsupported refuses (78: a rerun finds the same host) the one
// kind of host the upgrade does not serve: an image-based host whose
// agent rpm installed (bootc, rpm-ostree). Its override would read an
// .rpm without rpm, which the image-based path does not (it reads a
// .deb); the agent comes with the next image there.
func (u *Upgrade) refuseUnsupported(j *Journal, step string) error {
	if !j.Image || u.Packages.Format() == "deb" {
		return nil
	}
	return u.refuse(j, step, fmt.Errorf("%w: it is image-based (/usr is read-only) and its agent was installed by %s; "+
		"the agent comes with the host's next image", ErrUnsupportedHost, u.Packages.Format()))
}

// findStaged returns the package an operator staged: the file beside the
// first (by name) NAME.sha256 in the staging directory, and the sum the
// .sha256 file gives (sha256sum's format, or the sum alone).
func findStaged(p hostpaths.Paths) (file, sum string, err error) {
	ents, err := os.ReadDir(p.UpgradeStaged())
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".sha256")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		data, err := regfile.Read(filepath.Join(p.UpgradeStaged(), e.Name()), 4096)
		if err != nil {
			return "", "", err
		}
		f := strings.Fields(string(data))
		if len(f) == 0 || !validSHA256(strings.ToLower(f[0])) {
			return filepath.Join(p.UpgradeStaged(), name), "", fmt.Errorf("%s: not a SHA-256 (64 hex digits, as sha256sum writes it)", filepath.Join(p.UpgradeStaged(), e.Name()))
		}
		return filepath.Join(p.UpgradeStaged(), name), strings.ToLower(f[0]), nil
	}
	return "", "", nil
}

func (u *Upgrade) fetch(ctx context.Context, j *Journal) error {
	if err := os.MkdirAll(u.Paths.UpgradeStaged(), 0o700); err != nil {
		return err
	}
	client := u.HTTP
	if client == nil {
		c, err := httpClient(u.CAFile)
		if err != nil {
			return err
		}
		client = c
	}
	return fetch(ctx, client, u.log(), j.To, j.Source, j.SHA256, j.Staged)
}

// verify checks the staged package before anything changes: its sum, and
// that it is this agent's package, for this host's architecture, of the
// version asked for.
func (u *Upgrade) verify(ctx context.Context, j *Journal) error {
	got, err := artifacts.HashFile(j.Staged)
	if err != nil {
		return err
	}
	if got != j.SHA256 {
		return fmt.Errorf("package %s: %w: want sha256 %s, got %s", j.Staged, ErrChecksum, j.SHA256, got)
	}
	var m Meta
	var arch string
	if j.Image {
		// No package manager to ask: the package is read here.
		if m, err = DebMeta(j.Staged); err != nil {
			return err
		}
		arch = debArch()
	} else {
		if m, err = u.Packages.Inspect(ctx, j.Staged); err != nil {
			return err
		}
		if arch, err = u.Packages.Arch(ctx); err != nil {
			return err
		}
	}
	switch {
	case m.Name != Package:
		return fmt.Errorf("package %s is %s, not %s", j.Staged, m.Name, Package)
	case m.Arch != arch:
		return fmt.Errorf("package %s is for architecture %s, this host is %s", j.Staged, m.Arch, arch)
	case j.To != "" && !VersionIs(m.Version, j.To):
		return fmt.Errorf("package %s is version %s, the operation asks for %s", j.Staged, m.Version, j.To)
	}
	if !validVersion(m.Version) {
		return fmt.Errorf("package %s: version %q is not a package version", j.Staged, m.Version)
	}
	if (m.Version == j.From || (j.Image && SameVersion(m.Version, j.From))) && !j.IsDone(StepInstall) {
		return fmt.Errorf("%w: %s %s is installed already", ErrNothingToDo, Package, m.Version)
	}
	j.To = m.Version
	return nil
}

// keepPrevious puts the package of the running version into previous/:
// the one an earlier upgrade installed when it is that version, else the
// installed package repacked.
func (u *Upgrade) keepPrevious(ctx context.Context, j *Journal) error {
	if j.Image {
		// The image's agent stays in /usr; an override it replaces
		// stays staged until the record.
		o, err := state.ReadAgentOverride(u.Paths)
		if err != nil {
			return err
		}
		if o != nil {
			j.PreviousOverride = o.Version
		}
		return nil
	}
	dir := filepath.Join(u.Paths.UpgradeDir(), "previous")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	m, _, err := u.Packages.Installed(ctx, Package)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, packageFile(u.Packages.Format(), m))
	if installed := u.keptPackage(ctx, m, filepath.Join(u.Paths.UpgradeDir(), "installed")); installed != "" {
		data, err := os.ReadFile(installed)
		if err != nil {
			return err
		}
		if err := state.WriteFileAtomic(dst, data, 0o600); err != nil {
			return err
		}
	} else if err := u.Packages.Repack(ctx, Package, dst); err != nil {
		return err
	}
	j.Previous = dst
	return removeOthers(dir, dst)
}

// keptPackage is a package file of m in one of dirs (the first found),
// else "".
func (u *Upgrade) keptPackage(ctx context.Context, m Meta, dirs ...string) string {
	for _, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			f := filepath.Join(dir, e.Name())
			if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".sha256") || strings.HasSuffix(e.Name(), ".part") {
				continue
			}
			if got, err := u.Packages.Inspect(ctx, f); err == nil && got == m {
				return f
			}
		}
	}
	return ""
}

// agentExe is the multicall executable the units run for version: the
// override's staged one on an image-based host ("" version: the image's),
// else the installed one.
func (u *Upgrade) agentExe(j *Journal, version string) string {
	if j.Image && version != "" {
		return filepath.Join(stagedLibexec(u.Paths, version), "unbounded-agent")
	}
	return u.Paths.Libexec("unbounded-agent")
}

func (u *Upgrade) imageBased() bool {
	if u.ImageBased != nil {
		return u.ImageBased()
	}
	return usrReadOnly(u.Paths)
}

// activate restarts the daemon on exe and waits until it runs it and
// stays up.
func (u *Upgrade) activate(ctx context.Context, exe string) error {
	sd, err := u.Systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	begin := time.Now()
	u.restarted = true
	down, err := u.Wait.restart(ctx, sd, exe, func() { crashpoint.Via(u.CrashPoint, CrashAfterDaemonRestart) })
	if err == nil {
		u.log().Info("daemon restarted on the installed package", "down", down.Round(time.Millisecond).String(),
			"took", time.Since(begin).Round(time.Millisecond).String())
	}
	return err
}
