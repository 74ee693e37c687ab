package state

import (
	"fmt"
	"os"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// TmpfilesConfHost is the tmpfiles.d(5) entry, shipped by the package, that
// declares /run/unbounded (mode 0755, owner root:root).
const TmpfilesConfHost = "/usr/lib/tmpfiles.d/unbounded-agent.conf"

// RunDir returns /run/unbounded once it exists, and an error naming the
// tmpfiles.d entry when it does not.
//
// The agent does not create the directory itself: its mode and owner are
// declared once, in the package's tmpfiles.d entry, which
// systemd-tmpfiles-setup.service applies at every boot before any service
// starts, and the units' sandboxes need it to exist before their process
// runs (ReadWritePaths=/run/unbounded), so a directory the code made later
// would come too late anyway. Subdirectories (requests/) are the code's
// own layout and are created on use, inside it.
func RunDir(p hostpaths.Paths) (string, error) {
	dir := p.RunDir()
	fi, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("runtime directory %s: %w (it is created at boot from %s; run `systemd-tmpfiles --create unbounded-agent.conf`)", dir, err, TmpfilesConfHost)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("runtime directory %s is not a directory (it is declared in %s)", dir, TmpfilesConfHost)
	}
	return dir, nil
}
