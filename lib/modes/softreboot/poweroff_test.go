package softreboot

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The kubelet's period as nodestack writes it; none (an older slot's
// config, or the shutdown off) is 0; a bad one is an error naming the
// file.
func TestShutdownGraceReadsTheKubeletsConfig(t *testing.T) {
	dir := t.TempDir()
	for text, want := range map[string]time.Duration{
		"apiVersion: kubelet.config.k8s.io/v1beta1\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n": 30 * time.Second,
		"shutdownGracePeriod: \"1m0s\"\n": time.Minute,
		"kind: KubeletConfiguration\n":    0,
	} {
		f := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := ShutdownGrace(f); err != nil || got != want {
			t.Errorf("ShutdownGrace(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
	f := filepath.Join(dir, "bad.yaml")
	os.WriteFile(f, []byte("shutdownGracePeriod: soon\n"), 0o644)
	if _, err := ShutdownGrace(f); err == nil {
		t.Error("a bad shutdownGracePeriod was read without an error")
	}
}

// With the graceful shutdown off nothing is asked of the machine: the
// unit's stop signal powers it off (no systemctl is run: a slot that is
// no machine here would fail).
func TestPowerOffWithoutAGracePeriodLeavesTheStopToTheSignal(t *testing.T) {
	if err := PowerOff(context.Background(), "kube1", os.Getpid(), 0, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
}
