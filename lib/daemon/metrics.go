package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	fencerecord "unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/health"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/version"
)

// The host's own metrics ([daemon] metrics-address): what this host did
// and how its node stands, in Prometheus' text format (version 0.0.4),
// which every scraper reads. Written by hand rather than with
// prometheus/client_golang: that library costs the multicall executable
// 2.24 MiB (measured: 22.26 → 24.61 MB), and the hosts' binaries have
// 2.14 MiB left of their 40 MiB (ARCHITECTURE section 3).
//
// Counted by the daemon since it started: the operations it finished, by
// type and final state, with their durations. Read from the host at each
// scrape (nothing kept twice): the last outcome of each concern that
// records one (lib/outcome: bootstrap, repave, upgrade, isolation change;
// the upgrade's and the isolation change's until the daemon has reported
// them), the health check's counts (restarts since the node was last
// healthy, a give-up), the allocation fence's last decision, and the
// node stack's units: active or not, and how often systemd restarted them.

// opMetrics counts the operations the daemon finished.
type opMetrics struct {
	mu  sync.Mutex
	ops map[opKey]*opStat
}

type opKey struct{ operation, state string }

type opStat struct {
	count   int
	seconds float64
}

// observe counts one finished operation; took is 0 when its start is
// unknown (it still counts, with no duration).
func (m *opMetrics) observe(operation, state string, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ops == nil {
		m.ops = map[opKey]*opStat{}
	}
	k := opKey{operation, state}
	s := m.ops[k]
	if s == nil {
		s = &opStat{}
		m.ops[k] = s
	}
	s.count++
	s.seconds += max(took, 0).Seconds()
}

func (m *opMetrics) snapshot() map[opKey]opStat {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[opKey]opStat, len(m.ops))
	for k, s := range m.ops {
		out[k] = *s
	}
	return out
}

// metricsWriter writes one scrape: families in order, each with its HELP
// and TYPE lines once, label values escaped as the format asks.
type metricsWriter struct {
	b bytes.Buffer
}

func (w *metricsWriter) family(name, typ, help string) {
	fmt.Fprintf(&w.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// sample writes name{labels} value; labels are name, value pairs.
func (w *metricsWriter) sample(name string, value float64, labels ...string) {
	w.b.WriteString(name)
	if len(labels) > 0 {
		w.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				w.b.WriteByte(',')
			}
			w.b.WriteString(labels[i])
			w.b.WriteString(`="`)
			w.b.WriteString(labelEscaper.Replace(labels[i+1]))
			w.b.WriteByte('"')
		}
		w.b.WriteByte('}')
	}
	w.b.WriteByte(' ')
	w.b.WriteString(strconv.FormatFloat(value, 'g', -1, 64))
	w.b.WriteByte('\n')
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// writeMetrics writes the host's metrics. A record it cannot read leaves
// its family out and counts in unbounded_metrics_read_errors (a scrape
// never fails for one bad file).
func writeMetrics(ctx context.Context, out io.Writer, p hostpaths.Paths, ops *opMetrics, sd Systemd) error {
	var w metricsWriter
	readErrors := 0
	active, err := state.ReadActive(p)
	if err != nil {
		readErrors++
	}
	mode, slot := "", ""
	if active != nil {
		mode, slot = active.Mode, active.Slot
	}
	w.family("unbounded_agent_info", "gauge", "The agent's version and the active node's isolation mode and slot (empty before the first boot's record).")
	w.sample("unbounded_agent_info", 1, "version", version.Version, "mode", mode, "slot", slot)

	stats := ops.snapshot()
	keys := make([]opKey, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].operation != keys[j].operation {
			return keys[i].operation < keys[j].operation
		}
		return keys[i].state < keys[j].state
	})
	w.family("unbounded_operations_total", "counter", "Operations this daemon finished since it started, by type and final state.")
	for _, k := range keys {
		w.sample("unbounded_operations_total", float64(stats[k].count), "operation", k.operation, "state", k.state)
	}
	w.family("unbounded_operation_duration_seconds", "summary", "How long the operations this daemon finished took, from their start to their final state.")
	for _, k := range keys {
		w.sample("unbounded_operation_duration_seconds_sum", stats[k].seconds, "operation", k.operation, "state", k.state)
		w.sample("unbounded_operation_duration_seconds_count", float64(stats[k].count), "operation", k.operation, "state", k.state)
	}

	records, err := outcome.List(p)
	if err != nil {
		readErrors++
	}
	w.family("unbounded_last_outcome", "gauge", "The last run of each concern that records its outcome (bootstrap, repave, upgrade, isolation), by how it ended.")
	for _, r := range records {
		w.sample("unbounded_last_outcome", 1, "concern", r.Concern, "state", string(r.State), "reason", r.Reason)
	}
	w.family("unbounded_last_outcome_timestamp_seconds", "gauge", "When the last run of each concern ended.")
	for _, r := range records {
		w.sample("unbounded_last_outcome_timestamp_seconds", unixSeconds(r.Time), "concern", r.Concern)
	}
	w.family("unbounded_last_outcome_duration_seconds", "gauge", "How long the last run of each concern took (runs that recorded their start).")
	for _, r := range records {
		if !r.StartedAt.IsZero() && !r.Time.Before(r.StartedAt) {
			w.sample("unbounded_last_outcome_duration_seconds", r.Time.Sub(r.StartedAt).Seconds(), "concern", r.Concern)
		}
	}

	if h, err := health.ReadState(p); err != nil {
		readErrors++
	} else {
		w.family("unbounded_health_consecutive_failures", "gauge", "Unhealthy checks in a row since the node stack's last restart.")
		w.sample("unbounded_health_consecutive_failures", float64(h.Failures))
		w.family("unbounded_health_restarts", "gauge", "Restarts of the node stack the health check started since the node was last healthy (this boot).")
		w.sample("unbounded_health_restarts", float64(h.Restarts))
		w.family("unbounded_health_gave_up", "gauge", "1 while the health check has given up restarting the node (until it is healthy, a new applied config or a reboot).")
		w.sample("unbounded_health_gave_up", boolValue(h.GaveUp))
		w.family("unbounded_health_fence_retries", "gauge", "Node starts the health check retried after a fence check that got no answer (this boot).")
		w.sample("unbounded_health_fence_retries", float64(h.FenceRetries))
	}

	if f, err := fencerecord.Read(p); err != nil {
		readErrors++
	} else if f != nil {
		w.family("unbounded_fence_last_decision", "gauge", "The allocation fence's last decision (this boot), by outcome and reason.")
		w.sample("unbounded_fence_last_decision", 1, "outcome", string(f.Outcome), "reason", f.Reason)
		w.family("unbounded_fence_last_decision_timestamp_seconds", "gauge", "When the allocation fence last decided.")
		w.sample("unbounded_fence_last_decision_timestamp_seconds", unixSeconds(f.At))
	}

	if active != nil {
		units := facts.Supervising(active.Mode, active.Slot)
		type unitSample struct {
			unit string
			st   UnitState
		}
		var got []unitSample
		for _, u := range units {
			st, err := sd.UnitState(ctx, u)
			if err != nil {
				readErrors++
				continue
			}
			got = append(got, unitSample{u, st})
		}
		w.family("unbounded_node_stack_unit_active", "gauge", "1 while a unit that runs the active node stack is active.")
		for _, s := range got {
			w.sample("unbounded_node_stack_unit_active", boolValue(s.st.ActiveState == "active"), "unit", s.unit)
		}
		w.family("unbounded_node_stack_restarts_total", "counter", "How often systemd restarted a unit that runs the active node stack (its Restart=), since the unit was loaded.")
		for _, s := range got {
			w.sample("unbounded_node_stack_restarts_total", float64(s.st.NRestarts), "unit", s.unit)
		}
	}

	w.family("unbounded_metrics_read_errors", "gauge", "Sources this scrape could not read (a record, the service manager); their families are left out.")
	w.sample("unbounded_metrics_read_errors", float64(readErrors))
	_, err = out.Write(w.b.Bytes())
	return err
}

// metricsHandler serves GET /metrics.
func (d *daemon) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		var b bytes.Buffer
		if err := writeMetrics(ctx, &b, d.p, &d.metrics, d.sd); err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = rw.Write(b.Bytes())
	})
	return mux
}

// serveMetrics serves the host's metrics on addr until ctx ends. A listen
// that fails (the port taken) is logged and tried again every 30 s: the
// daemon's own work never waits on its metrics.
func (d *daemon) serveMetrics(ctx context.Context, addr string, listen func(string) (net.Listener, error)) {
	var lastErr string
	for {
		ln, err := listen(addr)
		if err == nil {
			d.log.Info("serving the host's metrics", "address", ln.Addr().String())
			d.serveMetricsOn(ctx, ln)
			return
		}
		if err.Error() != lastErr {
			d.log.Error("cannot serve the host's metrics; trying again every 30s", "address", addr, "error", err)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}

// serveMetricsOn serves on ln until ctx ends.
func (d *daemon) serveMetricsOn(ctx context.Context, ln net.Listener) {
	srv := &http.Server{
		Handler:           d.metricsHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		d.log.Error("the host's metrics server stopped", "error", err)
	}
	<-done
}
