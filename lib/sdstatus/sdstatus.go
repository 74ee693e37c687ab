// Package sdstatus shows what a one-shot operation (bootstrap, repave,
// reset) does now: in the journal and in `systemctl status` (sd_notify
// STATUS=).
package sdstatus

import (
	"fmt"
	"log/slog"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

// Show logs the message (format and args, as fmt.Sprintf) at info on log
// and sends it as STATUS= with notify; nil notify: sd_notify.
func Show(log *slog.Logger, notify func(state string), format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	log.Info(msg)
	Notify(notify, "STATUS="+msg)
}

// Notify sends state with notify; nil notify: sd_notify (nothing when the
// process does not run under systemd).
func Notify(notify func(state string), state string) {
	if notify != nil {
		notify(state)
		return
	}
	sddaemon.SdNotify(false, state)
}
