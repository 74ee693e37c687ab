package daemon

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	fencerecord "unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/state"
)

// scrape is one parsed scrape: "name{labels}" (labels as written) -> value.
type scrape map[string]float64

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$`)

// parseScrape parses the text format as a scraper does, and fails the test
// on a line it would refuse: a sample of a family without its TYPE line
// before it, a family declared twice, a value that is not a number.
func parseScrape(t *testing.T, text string) scrape {
	t.Helper()
	got := scrape{}
	typed := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			if _, dup := typed[name]; dup {
				t.Errorf("family %s declared twice", name)
			}
			typed[name] = typ
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("not a sample line: %q", line)
			continue
		}
		family := m[1]
		if typ := typed[strings.TrimSuffix(strings.TrimSuffix(family, "_sum"), "_count")]; typ == "" && typed[family] == "" {
			t.Errorf("sample %s without its family's TYPE line before it", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Errorf("sample %q: value: %v", line, err)
		}
		got[m[1]+m[2]] = v
	}
	return got
}

func (s scrape) want(t *testing.T, sample string, value float64) {
	t.Helper()
	got, ok := s[sample]
	if !ok {
		t.Errorf("no sample %s", sample)
		return
	}
	if got != value {
		t.Errorf("%s = %v, want %v", sample, got, value)
	}
}

// runRoot is a host root with /run/unbounded, as tmpfiles.d makes it.
func runRoot(t *testing.T) hostpaths.Paths {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHostMetricsShowTheOperationsAndWhatTheHostRecorded(t *testing.T) {
	p := runRoot(t)
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube2", Mode: "nspawn", Machine: "w1"}); err != nil {
		t.Fatal(err)
	}
	began := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	if err := outcome.Write(p, outcome.Record{Concern: outcome.Repave, State: outcome.Failed, Reason: outcome.ReasonRolledBack,
		Message: "new node \"never\" healthy", StartedAt: began, Time: began.Add(95 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteRunRecord(p, "health.json", map[string]any{"applied": "kube2", "failures": 2, "restarts": 1, "gaveUp": true}); err != nil {
		t.Fatal(err)
	}
	if err := fencerecord.Write(p, fencerecord.Record{Outcome: fencerecord.Refused, Reason: "AllocationFenced", At: began}); err != nil {
		t.Fatal(err)
	}
	sd := newFakeSystemd()
	sd.units["systemd-nspawn@kube2.service"] = &fakeUnit{st: UnitState{ActiveState: "active", NRestarts: 3}}

	var ops opMetrics
	ops.observe("Repave", "Complete", 40*time.Second)
	ops.observe("Repave", "Complete", 20*time.Second)
	ops.observe("Restart", "Failed", 0)

	var b strings.Builder
	if err := writeMetrics(context.Background(), &b, p, &ops, fakeConn{sd}); err != nil {
		t.Fatal(err)
	}
	s := parseScrape(t, b.String())
	s.want(t, `unbounded_operations_total{operation="Repave",state="Complete"}`, 2)
	s.want(t, `unbounded_operation_duration_seconds_sum{operation="Repave",state="Complete"}`, 60)
	s.want(t, `unbounded_operation_duration_seconds_count{operation="Repave",state="Complete"}`, 2)
	s.want(t, `unbounded_operations_total{operation="Restart",state="Failed"}`, 1)
	s.want(t, `unbounded_last_outcome{concern="repave",state="Failed",reason="RolledBack"}`, 1)
	s.want(t, `unbounded_last_outcome_duration_seconds{concern="repave"}`, 95)
	s.want(t, `unbounded_last_outcome_timestamp_seconds{concern="repave"}`, float64(began.Add(95*time.Second).Unix()))
	s.want(t, `unbounded_health_consecutive_failures`, 2)
	s.want(t, `unbounded_health_restarts`, 1)
	s.want(t, `unbounded_health_gave_up`, 1)
	s.want(t, `unbounded_fence_last_decision{outcome="refused",reason="AllocationFenced"}`, 1)
	s.want(t, `unbounded_node_stack_unit_active{unit="systemd-nspawn@kube2.service"}`, 1)
	s.want(t, `unbounded_node_stack_restarts_total{unit="systemd-nspawn@kube2.service"}`, 3)
	s.want(t, `unbounded_metrics_read_errors`, 0)
	if !strings.Contains(b.String(), `mode="nspawn",slot="kube2"}`) {
		t.Errorf("agent info without the active mode and slot:\n%s", b.String())
	}
}

// A record the daemon cannot read leaves its family out and is counted;
// the scrape goes on. A bare host (no applied config, nothing recorded)
// scrapes with no error and no node stack units.
func TestHostMetricsOfABareHostAndOfAnUnreadableRecord(t *testing.T) {
	p := runRoot(t)
	var ops opMetrics
	var b strings.Builder
	if err := writeMetrics(context.Background(), &b, p, &ops, fakeConn{newFakeSystemd()}); err != nil {
		t.Fatal(err)
	}
	s := parseScrape(t, b.String())
	s.want(t, `unbounded_metrics_read_errors`, 0)
	s.want(t, `unbounded_health_gave_up`, 0)
	if strings.Contains(b.String(), "unbounded_node_stack_unit_active{") {
		t.Errorf("node stack units on a host without a node:\n%s", b.String())
	}

	if err := state.WriteRunRecord(p, "health.json", "not an object"); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := writeMetrics(context.Background(), &b, p, &ops, fakeConn{newFakeSystemd()}); err != nil {
		t.Fatal(err)
	}
	s = parseScrape(t, b.String())
	s.want(t, `unbounded_metrics_read_errors`, 1)
	if strings.Contains(b.String(), "unbounded_health_gave_up ") {
		t.Errorf("health family from an unreadable record:\n%s", b.String())
	}
}

func TestMetricsLabelValuesAreEscaped(t *testing.T) {
	var w metricsWriter
	w.family("x", "gauge", "x")
	w.sample("x", 1, "reason", "a \"quoted\" \\ back\nslash")
	if got, want := w.b.String(), "# HELP x x\n# TYPE x gauge\n"+`x{reason="a \"quoted\" \\ back\nslash"} 1`+"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The daemon serves GET /metrics on its listener, in the text format's
// content type, refuses other methods and paths, and stops with its
// context.
func TestMetricsServedOverHTTPUntilTheDaemonStops(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	d := &daemon{p: p, sd: fakeConn{newFakeSystemd()}, log: slog.New(slog.DiscardHandler)}
	d.metrics.observe("Reboot", "Complete", time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.serveMetrics(ctx, "unused", func(string) (net.Listener, error) { return ln, nil })
	}()
	url := "http://" + ln.Addr().String()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Errorf("GET /metrics: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	parseScrape(t, string(body)).want(t, `unbounded_operations_total{operation="Reboot",state="Complete"}`, 1)
	for _, c := range []struct{ method, path string }{{"POST", "/metrics"}, {"GET", "/"}, {"GET", "/debug/pprof/"}} {
		req, _ := http.NewRequest(c.method, url+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("%s %s: %s, want a refusal", c.method, c.path, resp.Status)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the metrics server did not stop with its context")
	}
	if _, err := http.Get(url + "/metrics"); err == nil {
		t.Error("the metrics server still answers after its context ended")
	}
}

// A listen that fails (the port taken) is tried again, not fatal.
func TestMetricsListenIsRetriedNotFatal(t *testing.T) {
	d := &daemon{p: hostpaths.New(t.TempDir()), sd: fakeConn{newFakeSystemd()}, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	calls := 0
	d.serveMetrics(ctx, "127.0.0.1:1", func(string) (net.Listener, error) {
		calls++
		return nil, &net.OpError{Op: "listen", Err: io.ErrUnexpectedEOF}
	})
	if calls != 1 {
		t.Errorf("listen tried %d times within 50ms, want 1 (then every 30s)", calls)
	}
}
