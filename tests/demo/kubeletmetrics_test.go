package demo_test

// Not behind the demo build tag: the unit tier runs the parser's test
// (kubeletmetrics_parse_test.go), the demo uses the parser.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// kubeletStartupMetrics are the kubelet's gauges of its own start, in the
// order of the start: k8s.io/kubernetes v1.36.3 pkg/kubelet/metrics
// (subsystem "kubelet", NodeStartup*Key), set by
// pkg/kubelet/util/node_startup_latency_tracker.go. pre_kubelet and the
// total count from the kernel's boot time (/proc/stat btime), which in a
// container is the machine's that runs it, not the container's start.
var kubeletStartupMetrics = []string{
	"kubelet_node_startup_pre_kubelet_duration_seconds",
	"kubelet_node_startup_pre_registration_duration_seconds",
	"kubelet_node_startup_registration_duration_seconds",
	"kubelet_node_startup_post_registration_duration_seconds",
	"kubelet_node_startup_duration_seconds",
}

// parseStartupMetrics reads kubeletStartupMetrics from a Prometheus text
// exposition (the kubelet's /metrics). github.com/prometheus/common is not
// a requirement of this module, and these are plain unlabelled gauges: a
// line "NAME VALUE [TIMESTAMP]" each. Every one must be there once.
func parseStartupMetrics(text string) (map[string]float64, error) {
	got := map[string]float64{}
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name := l
		if j := strings.IndexAny(l, "{ \t"); j >= 0 {
			name = l[:j]
		}
		if !slices.Contains(kubeletStartupMetrics, name) {
			continue
		}
		rest := l[len(name):]
		if strings.HasPrefix(rest, "{") {
			// Labels: the value follows the closing brace.
			j := strings.LastIndex(rest, "}")
			if j < 0 {
				return nil, fmt.Errorf("line %d: %q: labels not closed", i+1, l)
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 || len(f) > 2 {
			return nil, fmt.Errorf("line %d: %q: want NAME VALUE [TIMESTAMP]", i+1, l)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: %q: %v", i+1, l, err)
		}
		if _, dup := got[name]; dup {
			return nil, fmt.Errorf("line %d: %s a second time", i+1, name)
		}
		got[name] = v
	}
	var missing []string
	for _, n := range kubeletStartupMetrics {
		if _, ok := got[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return got, fmt.Errorf("no %s", strings.Join(missing, ", "))
	}
	return got, nil
}
