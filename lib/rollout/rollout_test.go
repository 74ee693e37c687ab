package rollout

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

func TestBudgetRoundsDownButIsAtLeastOne(t *testing.T) {
	for _, c := range []struct {
		n     intstr.IntOrString
		total int
		want  int
	}{
		{intstr.FromInt32(2), 10, 2},
		{intstr.FromInt32(0), 10, 1},
		{intstr.FromString("25%"), 10, 2},
		{intstr.FromString("25%"), 3, 1},
		{intstr.FromString("10%"), 200, 20},
		{intstr.FromString("100%"), 7, 7},
		{intstr.FromString("1%"), 50, 1},
	} {
		got, err := Budget(&c.n, c.total)
		if err != nil || got != c.want {
			t.Errorf("%s of %d: %d, %v; want %d", c.n.String(), c.total, got, err, c.want)
		}
	}
	if got, _ := Budget(nil, 10); got != 1 {
		t.Errorf("no maxUnavailable: %d, want 1", got)
	}
	bad := intstr.FromString("many")
	if _, err := Budget(&bad, 10); err == nil {
		t.Error(`"many" accepted`)
	}
	neg := intstr.FromInt32(-1)
	if _, err := Budget(&neg, 10); err == nil {
		t.Error("-1 accepted")
	}
}

func at(t *testing.T, zone, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	v, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestWindowsAcrossMidnightDaysAndDaylightSavingTime(t *testing.T) {
	const berlin = "Europe/Berlin"
	night := &v1alpha3.MaintenanceWindow{Start: "22:00", End: "04:00", TimeZone: berlin, Days: []v1alpha3.Weekday{"Sat"}}
	for _, c := range []struct {
		w     *v1alpha3.MaintenanceWindow
		now   string
		open  bool
		opens string // when closed
	}{
		{nil, "2026-12-07 12:00", true, ""},
		// Saturday 22:00 to Sunday 04:00, Berlin.
		{night, "2026-12-05 21:59", false, "2026-12-05 22:00"},
		{night, "2026-12-05 22:00", true, ""},
		{night, "2026-12-06 03:59", true, ""}, // Sunday, in Saturday's window
		{night, "2026-12-06 04:00", false, "2026-12-12 22:00"},
		{night, "2026-12-07 12:00", false, "2026-12-12 22:00"},
		// Every day 09:00-17:00 UTC.
		{&v1alpha3.MaintenanceWindow{Start: "09:00", End: "17:00"}, "2026-12-07 17:00", false, "2026-12-08 09:00"},
		// Spring forward (2027-03-28, 02:00 CET to 03:00 CEST): a
		// 01:30-03:30 window lasts one hour of real time, and 03:10 is in it.
		{&v1alpha3.MaintenanceWindow{Start: "01:30", End: "03:30", TimeZone: berlin}, "2027-03-28 03:10", true, ""},
		{&v1alpha3.MaintenanceWindow{Start: "01:30", End: "03:30", TimeZone: berlin}, "2027-03-28 03:30", false, "2027-03-29 01:30"},
		// Fall back: 2026-10-25 02:30 happens twice; 01:00-03:00 lasts three hours.
		{&v1alpha3.MaintenanceWindow{Start: "01:00", End: "03:00", TimeZone: berlin}, "2026-10-25 02:59", true, ""},
	} {
		var now time.Time
		zone := berlin
		if c.w != nil && c.w.TimeZone == "" {
			zone = "UTC"
		}
		now = at(t, zone, c.now)
		open, opens, err := Open(c.w, now)
		if err != nil {
			t.Errorf("%v at %s: %v", c.w, c.now, err)
			continue
		}
		if open != c.open {
			t.Errorf("%+v at %s: open %v, want %v", c.w, c.now, open, c.open)
		}
		if !c.open && !opens.Equal(at(t, zone, c.opens)) {
			t.Errorf("%+v at %s: opens %s, want %s", c.w, c.now, opens.In(now.Location()), c.opens)
		}
	}
	// The fall-back night's window lasts three hours of real time.
	w := &v1alpha3.MaintenanceWindow{Start: "01:00", End: "03:00", TimeZone: berlin}
	start := at(t, berlin, "2026-10-25 01:00")
	if open, _, _ := Open(w, start.Add(2*time.Hour+50*time.Minute)); !open {
		t.Error("the fall-back night's window closed before its three hours")
	}
	if open, _, _ := Open(w, start.Add(3*time.Hour)); open {
		t.Error("the fall-back night's window open after three hours")
	}
	for _, bad := range []*v1alpha3.MaintenanceWindow{
		{Start: "25:00", End: "03:00"}, {Start: "01:00", End: "3pm"},
		{Start: "01:00", End: "03:00", TimeZone: "Mars/Olympus"}, {Start: "01:00", End: "03:00", Days: []v1alpha3.Weekday{"Funday"}},
	} {
		if _, _, err := Open(bad, time.Now()); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func rollout(maxU intstr.IntOrString) *v1alpha3.MachineRollout {
	return &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: "r1", Generation: 1},
		Spec: v1alpha3.MachineRolloutSpec{Operation: v1alpha3.OperationRepave, MaxUnavailable: &maxU, ReadySeconds: 30, FailureThreshold: 1}}
}

func node(name, zone string, readySince time.Time) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"zone": zone}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.NewTime(readySince), LastTransitionTime: metav1.NewTime(readySince)}}}}
}

func op(name string, state v1alpha3.OperationState, start, end time.Time) *v1alpha3.MachineOperation {
	o := &v1alpha3.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{GenerationLabel: "1"}},
		Spec:   v1alpha3.MachineOperationSpec{Operation: v1alpha3.OperationRepave},
		Status: v1alpha3.MachineOperationStatus{State: state}}
	if !start.IsZero() {
		o.Status.StartTime = &metav1.Time{Time: start}
	}
	if !end.IsZero() {
		o.Status.CompletionTime = &metav1.Time{Time: end}
	}
	return o
}

func fleet(n int, zones ...string) []Host {
	var hs []Host
	for i := range n {
		name := fmt.Sprintf("m%02d", i+1)
		z := ""
		if len(zones) > 0 {
			z = zones[i%len(zones)]
		}
		hs = append(hs, Host{Name: name, Node: node(name, z, t0.Add(-time.Hour))})
	}
	return hs
}

func TestDecideStartsWithinTheBudgetsInNameOrder(t *testing.T) {
	r := rollout(intstr.FromString("25%"))
	d, err := Decide(r, fleet(10), t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(d.Start, ","); got != "m01,m02" || d.Phase != v1alpha3.RolloutProgressing || d.Unavailable != 2 {
		t.Errorf("started %s, phase %s, unavailable %d; want m01,m02 (25%% of 10 rounded down)", got, d.Phase, d.Unavailable)
	}
	if h := d.Hosts[0]; h.Operation != "m01-r1" || h.Attempt != 1 || h.State != v1alpha3.HostInProgress {
		t.Errorf("m01: %+v", h)
	}
	// Per zone: 4 hosts in a and b, 1 at a time in each, 3 overall.
	r = rollout(intstr.FromInt32(3))
	r.Spec.Topology = &v1alpha3.TopologyLimit{Key: "zone", MaxUnavailable: intstr.FromInt32(1)}
	d, _ = Decide(r, fleet(8, "a", "b"), t0)
	if got := strings.Join(d.Start, ","); got != "m01,m02" {
		t.Errorf("per zone: started %s, want m01 (a) and m02 (b)", got)
	}
	// A host with another operation in flight waits; the next goes.
	hs := fleet(3)
	hs[0].Busy = "m01-other"
	d, _ = Decide(rollout(intstr.FromInt32(1)), hs, t0)
	if got := strings.Join(d.Start, ","); got != "m02" || !strings.Contains(d.Hosts[0].Message, "m01-other") {
		t.Errorf("started %s, m01 says %q", got, d.Hosts[0].Message)
	}
}

func TestDecideHealthGateFailureThresholdPauseAndWindow(t *testing.T) {
	r := rollout(intstr.FromInt32(1))
	hs := fleet(3)
	started := t0.Add(-2 * time.Minute)
	// m01 completed 10 s ago and its kubelet wrote Ready since: the gate
	// holds it 20 s more; the budget is full.
	hs[0].Op, hs[0].Attempt = op("m01-r1", v1alpha3.OperationComplete, started, t0.Add(-10*time.Second)), 1
	hs[0].Node = node("m01", "", t0.Add(-12*time.Second))
	d, _ := Decide(r, hs, t0)
	if d.Hosts[0].State != v1alpha3.HostVerifying || len(d.Start) != 0 || !d.Next.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("gate: %+v start %v next %v", d.Hosts[0], d.Start, d.Next)
	}
	// A Ready from before the operation started does not pass the gate.
	hs[0].Node = node("m01", "", started.Add(-time.Minute))
	if d, _ = Decide(r, hs, t0.Add(time.Hour)); d.Hosts[0].State != v1alpha3.HostVerifying {
		t.Errorf("stale Ready: %+v", d.Hosts[0])
	}
	// 30 s after: done, the next host starts.
	hs[0].Node = node("m01", "", t0.Add(-12*time.Second))
	d, _ = Decide(r, hs, t0.Add(20*time.Second))
	if d.Hosts[0].State != v1alpha3.HostDone || strings.Join(d.Start, ",") != "m02" {
		t.Fatalf("after the gate: %+v start %v", d.Hosts[0], d.Start)
	}
	// Recovery reporting a failure since the operation started fails the gate.
	hs[0].Machine = &v1alpha3.Machine{Status: v1alpha3.MachineStatus{Conditions: []metav1.Condition{{Type: v1alpha3.ConditionRecovered,
		Status: metav1.ConditionFalse, Reason: "RepairFailed", LastTransitionTime: metav1.NewTime(t0.Add(-5 * time.Second))}}}}
	d, _ = Decide(r, hs, t0.Add(20*time.Second))
	if d.Hosts[0].State != v1alpha3.HostFailed || d.Phase != v1alpha3.RolloutStopped || len(d.Start) != 0 {
		t.Fatalf("recovery failed: %+v phase %s start %v", d.Hosts[0], d.Phase, d.Start)
	}
	// A changed spec retries the failed host as attempt 2.
	r.Generation = 2
	d, _ = Decide(r, hs, t0.Add(20*time.Second))
	if h := d.Hosts[0]; h.State != v1alpha3.HostInProgress || h.Operation != "m01-r1-2" || h.Attempt != 2 || h.Generation != 2 {
		t.Fatalf("retry: %+v", h)
	}
	// A failed operation, threshold 2: the rollout goes on.
	r = rollout(intstr.FromInt32(1))
	r.Spec.FailureThreshold = 2
	hs = fleet(3)
	hs[0].Op, hs[0].Attempt = op("m01-r1", v1alpha3.OperationFailed, started, t0), 1
	d, _ = Decide(r, hs, t0)
	if d.Phase != v1alpha3.RolloutProgressing || strings.Join(d.Start, ",") != "m02" || d.Failed != 1 {
		t.Errorf("threshold 2: phase %s start %v failed %d", d.Phase, d.Start, d.Failed)
	}
	// Paused, and outside the window: nothing starts; the window's opening is the next action.
	r.Spec.Paused = true
	if d, _ = Decide(r, hs, t0); d.Phase != v1alpha3.RolloutPaused || len(d.Start) != 0 {
		t.Errorf("paused: %s %v", d.Phase, d.Start)
	}
	r.Spec.Paused = false
	r.Spec.Window = &v1alpha3.MaintenanceWindow{Start: "22:00", End: "02:00"}
	if d, _ = Decide(r, hs, t0); d.Phase != v1alpha3.RolloutOutsideWindow || len(d.Start) != 0 || !d.Next.Equal(time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)) {
		t.Errorf("outside the window: %s %v next %v", d.Phase, d.Start, d.Next)
	}
	// An operation recorded as started that is gone has failed.
	r = rollout(intstr.FromInt32(1))
	r.Status.Hosts = []v1alpha3.RolloutHost{{Name: "m01", State: v1alpha3.HostInProgress, Attempt: 1, Operation: "m01-r1", Generation: 1}}
	if d, _ = Decide(r, fleet(2), t0); d.Hosts[0].State != v1alpha3.HostFailed || !strings.Contains(d.Hosts[0].Message, "deleted") {
		t.Errorf("deleted operation: %+v", d.Hosts[0])
	}
}

func TestDecideCompletes(t *testing.T) {
	r := rollout(intstr.FromInt32(2))
	hs := fleet(2)
	for i := range hs {
		hs[i].Op, hs[i].Attempt = op(OperationName("r1", hs[i].Name, 1), v1alpha3.OperationComplete, t0.Add(-time.Hour), t0.Add(-time.Hour)), 1
		hs[i].Node = node(hs[i].Name, "", t0.Add(-50*time.Minute))
	}
	d, _ := Decide(r, hs, t0)
	if d.Phase != v1alpha3.RolloutComplete || d.Done != 2 {
		t.Errorf("phase %s done %d", d.Phase, d.Done)
	}
	if d, _ := Decide(r, nil, t0); d.Phase != v1alpha3.RolloutComplete || !strings.Contains(d.Message, "no Machine matched") {
		t.Errorf("no hosts: phase %s, %q", d.Phase, d.Message)
	}
	if n := OperationName(strings.Repeat("r", 250), "m01", 3); len(n) > 253 {
		t.Errorf("a long name: %d characters", len(n))
	}
}
