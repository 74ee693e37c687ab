package softreboot

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// PowerOffMargin is how much longer than the kubelet's shutdownGracePeriod
// PowerOff waits for the machine to be gone: the node's own stop of its
// units after the kubelet released its lock (each bounded to 10 s in the
// node, nspawn.StopConf) and systemd-nspawn's exit.
const PowerOffMargin = 15 * time.Second

// PowerOff is the graceful stop of a node machine (an nspawn machine or
// the container mode's container), run by its unit's ExecStop= before
// systemd's stop signal: it asks the machine's own logind to power it off
// (`systemctl --machine=SLOT poweroff`, a client of logind as an
// operator's poweroff in the machine would be) and waits until the
// machine's supervisor, pid (the unit's $MAINPID), has exited, at most
// grace + PowerOffMargin.
//
// Why: the unit's own stop (SIGTERM to systemd-nspawn, which sends the
// machine's systemd SIGRTMIN+4; the container unit's --kill-signal) powers
// the machine off without logind, so logind never sends
// PrepareForShutdown and the kubelet's graceful node shutdown (which holds
// a delay lock of the machine's logind for shutdownGracePeriod) never
// runs: the pods' processes then meet the machine's final kill instead of
// their grace periods. Through logind, the kubelet ends the pods in order
// first, marks them and the Node as shut down, and releases its lock.
//
// grace is the kubelet's shutdownGracePeriod (ShutdownGrace); 0 (graceful
// node shutdown off) returns at once, and so does a request the machine
// refuses or cannot take (no logind, not booted yet): the unit's stop
// signal then powers the machine off as before. A nil error means the
// machine is gone or the wait's bound passed (said in the log).
func PowerOff(ctx context.Context, slot string, pid int, grace time.Duration, log *slog.Logger) error {
	if grace <= 0 {
		log.Info("graceful node shutdown is off (shutdownGracePeriod 0); the unit's stop signal powers the machine off", "slot", slot)
		return nil
	}
	var pidfd int = -1
	if pid > 0 {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return fmt.Errorf("machine %s: its supervisor %d: %w", slot, pid, err)
		}
		pidfd = fd
		defer unix.Close(pidfd)
	}
	begin := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	out, err := exec.CommandContext(rctx, "systemctl", "--machine="+slot, "--no-ask-password", "poweroff").CombinedOutput()
	cancel()
	if err != nil {
		return fmt.Errorf("machine %s: systemctl --machine=%s poweroff: %w: %s", slot, slot, err, bytes.TrimSpace(out))
	}
	if pidfd < 0 {
		return nil
	}
	bound := grace + PowerOffMargin
	log.Info("the machine's logind powers it off; its kubelet ends the pods (graceful node shutdown)", "slot", slot, "atMost", bound)
	deadline := begin.Add(bound)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			log.Warn("the machine is still running after the graceful shutdown's bound; the unit's stop signal ends it", "slot", slot, "waited", time.Since(begin).Round(time.Millisecond))
			return nil
		}
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(min(left, time.Second).Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("machine %s: wait for its supervisor %d: %w", slot, pid, err)
		}
		if n > 0 {
			log.Info("the machine powered off", "slot", slot, "took", time.Since(begin).Round(time.Millisecond))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// ShutdownGrace reads the kubelet's shutdownGracePeriod from its
// configuration file (as lib/modes/nodestack writes it: one
// "shutdownGracePeriod: 30s" line); none is 0.
func ShutdownGrace(kubeletConfig string) (time.Duration, error) {
	data, err := os.ReadFile(kubeletConfig)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "shutdownGracePeriod:")
		if !ok {
			continue
		}
		d, err := time.ParseDuration(strings.Trim(strings.TrimSpace(v), `"'`))
		if err != nil {
			return 0, fmt.Errorf("%s: shutdownGracePeriod: %w", kubeletConfig, err)
		}
		return d, nil
	}
	return 0, sc.Err()
}
