package system_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// A refusal for lack of an answer comes back by itself. One host (mode
// none, launched for an allocation, a fence budget of 5 s) reboots twice
// while the API server is out of its reach past the fence's budget, then
// back, and its node comes up without anyone starting it: health retries
// the node start, and with it the fence, with a growing delay.
//
//   - API server unreachable: the forward to the host closes every
//     connection (what a host sees of a cluster that is down).
//   - Clock a year behind: the host's clock cannot be set apart from the
//     VM's (the test host shares the VM's kernel clock), so the boundary
//     the fence sees is reproduced instead: the forward presents a
//     certificate signed by the cluster CA but valid only from a year from
//     now, which is exactly what crypto/x509 reports for the real
//     certificate on a host whose clock is a year behind ("certificate has
//     expired or is not yet valid: current time ... is before ..."). Then
//     it presents the real one again (the clock is set).
func TestHealthStartsTheNodeOnceTheFenceGetsAnAnswerAgainAfterBoot(t *testing.T) {
	defer scenario(t)()
	uid := string(uuid.NewUUID())
	f := newFirstBoot(t, firstBootOptions{mode: "none", extra: fmt.Sprintf("\n[allocation]\nuid = %q\n\n[fence]\nretry-budget = \"5s\"\n", uid)})
	logJournalsOnFailure(t, f)
	allocatedHost(t, f, uid)
	healthTimings{interval: 3 * time.Second, failures: 3, maxRestarts: 2, restartTimeout: 2 * time.Minute}.write(f)
	begin := time.Now()
	f.m.Start()
	f.wantBootstrapped(t, "none", kubeletUnit)
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	if t.Failed() {
		return
	}
	node := nodeUID(t, f)

	for _, c := range []struct {
		name   string
		fault  nodestack.ForwardFault
		reason string
	}{
		{"API server unreachable", nodestack.ForwardFault{Down: true}, v1alpha3.ReasonClusterUnreachable},
		{"clock a year behind", nodestack.ForwardFault{TLS: futureServerCert(t, f)}, fence.ReasonClockSkew},
	} {
		t.Logf("== %s at boot", c.name)
		f.fwd.SetFault(f.env.Host(), c.fault)
		rebooted := time.Now()
		f.m.Reboot()
		t.Logf("reboot: %v", time.Since(rebooted).Round(time.Millisecond))
		// The boot's fence refused for lack of an answer; the node is down.
		waitUntil(t, 2*time.Minute, "the boot's fence refused for lack of an answer", func(context.Context) (bool, error) {
			r := fenceRecord(t, f.m)
			return r != nil && r.At.After(rebooted) && r.Outcome == record.NoAnswer, nil
		})
		if r := fenceRecord(t, f.m); r.Reason != c.reason {
			t.Errorf("%s: fence record %+v, want reason %s", c.name, r, c.reason)
		}
		if a := isActive(f.m, kubeletUnit); a == "active" {
			t.Errorf("%s: the kubelet runs although the fence refused", c.name)
		}
		// Health tries again (each try runs the fence), and the fence
		// refuses again while the cluster stays out of reach.
		waitUntil(t, 3*time.Minute, "health retried the node start", func(context.Context) (bool, error) {
			return strings.Count(progLog(f.m, "fence"), "refused for lack of an answer") >= 2, nil
		})
		if a := isActive(f.m, kubeletUnit); a == "active" {
			t.Errorf("%s: the kubelet runs although every fence refused", c.name)
		}
		// The cluster is back (the clock is set): nobody starts the node.
		f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{})
		back := time.Now()
		waitUntil(t, 4*time.Minute, "the node up again by itself", func(context.Context) (bool, error) {
			return isActive(f.m, nodeTarget) == "active" && isActive(f.m, kubeletUnit) == "active", nil
		})
		t.Logf("%s: node up %v after the cluster answered again (%d fence refusals in this boot)", c.name,
			time.Since(back).Round(time.Millisecond), strings.Count(progLog(f.m, "fence"), "refused for lack of an answer"))
		if r := fenceRecord(t, f.m); r == nil || r.Outcome != record.Allowed {
			t.Errorf("%s: fence record %+v, want allowed", c.name, r)
		}
		waitNodeReadySince(t, f, node, back, 3*time.Minute)
	}
}
