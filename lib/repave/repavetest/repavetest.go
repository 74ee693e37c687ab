// Package repavetest is the fake cluster, mode and health of the tests of
// the operations on the repave's steps (lib/repave, lib/isolation), over
// lib/testhost's scratch host. The fakes keep their state in files under
// the world's root (fake/), so that a crashed child process leaves it for
// the next run.
package repavetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/testhost"
)

// Fake is the file of the fakes' state name (fake/<name> under the
// world's root): tests create or read it.
func Fake(w *testhost.World, name string) string { return filepath.Join(w.Root, "fake", name) }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// cluster is the fake Node: fake/node holds its UID, fake/unschedulable
// says it is cordoned, fake/drain-stuck makes a drain time out,
// fake/bare-pod puts a pod without a controller on it, which the drain
// refuses as lib/kube's does unless told to evict it.
type cluster struct {
	w *testhost.World
	o repave.Options
}

func (c cluster) GetNode(context.Context) (*corev1.Node, error) {
	uid, err := os.ReadFile(Fake(c.w, "node"))
	if err != nil {
		return nil, nil
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testhost.Machine, UID: k8stypes.UID(typesUID(uid))}}
	n.Spec.Unschedulable = exists(Fake(c.w, "unschedulable"))
	return n, nil
}

func typesUID(b []byte) string { return strings.TrimSpace(string(b)) }

func (c cluster) SetUnschedulable(_ context.Context, on bool) error {
	c.w.Log(fmt.Sprintf("cluster unschedulable=%t", on))
	if on {
		return os.WriteFile(Fake(c.w, "unschedulable"), nil, 0o644)
	}
	if _, err := os.Stat(Fake(c.w, "api-down-at-uncordon")); err == nil {
		return &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}
	}
	os.Remove(Fake(c.w, "unschedulable"))
	return nil
}

func (c cluster) Drain(context.Context) error {
	c.w.Log("cluster drain")
	if exists(Fake(c.w, "bare-pod")) {
		if !c.o.DeleteUnmanaged {
			return fmt.Errorf("drain node %s: %w: ns/bare (no ownerReference with controller=true: nothing would create them again); nothing was evicted", testhost.Machine, kube.ErrUnmanagedPods)
		}
		c.w.Log("cluster evict ns/bare")
	}
	if exists(Fake(c.w, "drain-stuck")) {
		return fmt.Errorf("%w (1s) on node %s: 1 pod(s) left; ns/p: eviction refused (429)", kube.ErrDrainTimeout, testhost.Machine)
	}
	return nil
}

func (c cluster) DeleteNode(context.Context) error {
	// The old kubelet must be gone: it would register the Node again.
	if c.w.UnitState("systemd-nspawn@kube1.service") == "active" && c.w.UnitState("systemd-nspawn@kube2.service") == "active" {
		return errors.New("both machines run")
	}
	c.w.Log("cluster delete-node")
	os.Remove(Fake(c.w, "node"))
	os.Remove(Fake(c.w, "unschedulable"))
	return nil
}

// repaveMode is the world's fake mode with a blue/green Repave over its
// files and fake units.
type repaveMode struct {
	modes.Mode
	w *testhost.World
}

func (m repaveMode) Repave(ctx context.Context, running string, s modes.Slot, h modes.RepaveHooks) error {
	newUnit := "systemd-nspawn@" + s.Name + ".service"
	if m.w.UnitState(newUnit) != "active" {
		if !exists(filepath.Join(m.w.P.MachineDir(s.Name), "prepared")) {
			if err := m.Prepare(ctx, s); err != nil {
				return err
			}
		}
		h.Crash("repave/after-new-built")
		m.w.SetUnitState("systemd-nspawn@"+running+".service", "inactive")
		m.w.Log("stop systemd-nspawn@" + running + ".service")
		h.Crash("repave/after-old-stopped")
		if err := h.Fence(ctx); err != nil {
			return err
		}
		if err := m.Start(ctx, s.Name); err != nil {
			return err
		}
		h.Crash("repave/after-new-started")
	}
	if err := h.Healthy(ctx, s.Name); err != nil {
		if derr := m.Destroy(ctx, s.Name); derr != nil {
			return derr
		}
		if err := m.Start(ctx, running); err != nil {
			return err
		}
		return fmt.Errorf("%v; rolled back: %w", err, modes.ErrRolledBack)
	}
	return nil
}

// New is a repave on w with the fakes: the world's modes with a
// blue/green Repave, its service manager, the fake cluster and health.
func New(w *testhost.World, log *slog.Logger) *repave.Repave {
	b := w.Bootstrap(log)
	return &repave.Repave{
		Host: steps.Host{Paths: w.P, Systemd: b.Systemd, Notify: func(string) {}, CrashPoint: crashpoint.Hit, Log: log},
		Mode: func(name string) (modes.Mode, error) {
			m, err := w.Mode(name)
			if err != nil {
				return nil, err
			}
			return repaveMode{Mode: m, w: w}, nil
		},
		Cluster: func(_ *config.Config, o repave.Options) (repave.Cluster, error) { return cluster{w, o}, nil },
		Healthy: func(_ context.Context, _ *config.Config, slot string, m modes.Mode) error {
			for _, u := range facts.Supervising(m.Name(), slot) {
				if w.UnitState(u) != "active" {
					return errors.New(u + " not running")
				}
			}
			if exists(Fake(w, "unhealthy-"+slot)) {
				return fmt.Errorf("node not up within 1s; still missing: Node %s Ready", testhost.Machine)
			}
			// The new kubelet registers the Node afresh.
			return os.WriteFile(Fake(w, "node"), []byte(slot), 0o644)
		},
	}
}

// Bootstrapped is a world whose first boot ran (slot kube1, Node there).
func Bootstrapped(t *testing.T) *testhost.World {
	t.Helper()
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Bootstrap(slog.New(slog.NewTextHandler(io.Discard, nil))).Run(context.Background()); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if err := os.WriteFile(Fake(w, "node"), []byte("kube1"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.ClearCalls()
	return w
}

// Order asserts that calls has each of want, in that order.
func Order(t *testing.T, calls []string, want ...string) {
	t.Helper()
	last := -1
	for _, c := range want {
		i := slices.Index(calls, c)
		if i < 0 {
			t.Fatalf("no call %q in %q", c, calls)
		}
		if i < last {
			t.Fatalf("call %q came before %q; calls: %q", c, want[slices.Index(want, c)-1], calls)
		}
		last = i
	}
}
