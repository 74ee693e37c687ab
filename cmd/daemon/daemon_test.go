package daemon

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/daemon"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// refuseHost fails the test if the daemon gets as far as the host: an owned
// host must stop it before it connects to anything.
func refuseHost(t *testing.T) daemon.Host {
	return daemon.Host{
		Systemd: func(context.Context) (daemon.Systemd, error) {
			t.Error("daemon connected to systemd on an owned host")
			return nil, context.Canceled
		},
		// READY=1 is all it may say: systemd would otherwise count the
		// exit as a protocol violation (see lib/daemon.Run).
		Notify: func(s string) error {
			if !strings.HasPrefix(s, "READY=1\n") {
				t.Errorf("daemon notified %q on an owned host", s)
			}
			return nil
		},
	}
}

func TestOwnedHostExits69WithNoOutput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, p hostpaths.Paths)
	}{
		{"lock held", func(t *testing.T, p hostpaths.Paths) {
			// /run/unbounded, as systemd-tmpfiles creates it at boot.
			if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
				t.Fatal(err)
			}
			lock, err := state.AcquireOwnership(p, "bootstrap", "unbounded-bootstrap.service")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lock.Release() })
		}},
		{"record left by a crashed installation", func(t *testing.T, p hostpaths.Paths) {
			if err := state.WriteFileAtomic(p.Ownership(), []byte(`{"owner":"reset","since":"2026-01-02T03:04:05Z"}`+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"unreadable record", func(t *testing.T, p hostpaths.Paths) {
			if err := state.WriteFileAtomic(p.Ownership(), []byte("{garbage"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, hostpaths.New(root))
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			code := run(ctx, []string{"--root", root}, &stdout, &stderr, refuseHost(t))
			if code != exitcode.Deferred {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitcode.Deferred, stderr.String())
			}
			if stdout.Len()+stderr.Len() != 0 {
				t.Fatalf("owned host printed output:\nstdout: %q\nstderr: %q", stdout.String(), stderr.String())
			}
		})
	}
}

func TestMissingConfigExits78NamingTheFile(t *testing.T) {
	root := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--root", root}, &stdout, &stderr, refuseHost(t))
	if code != exitcode.ConfigInvalid {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitcode.ConfigInvalid, stderr.String())
	}
	if !bytes.Contains(stderr.Bytes(), []byte("agent.toml")) {
		t.Errorf("error does not name the config file:\n%s", stderr.String())
	}
}
