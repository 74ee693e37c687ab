package demo_test

import (
	"strings"
	"testing"
)

// startupMetricsText is a kubelet v1.36.3 /metrics excerpt: the startup
// gauges as component-base writes them (ALPHA in their HELP), among other
// metrics, one of which has a name that begins with a gauge's.
const startupMetricsText = `# HELP kubelet_node_name [ALPHA] The node's name. The count is always 1.
# TYPE kubelet_node_name gauge
kubelet_node_name{node="demo-0a1b2c"} 1
# HELP kubelet_node_startup_duration_seconds [ALPHA] Duration in seconds of node startup in total.
# TYPE kubelet_node_startup_duration_seconds gauge
kubelet_node_startup_duration_seconds 3712.25
# a comment that is neither HELP nor TYPE
kubelet_node_startup_duration_seconds_extra 99
# HELP kubelet_node_startup_post_registration_duration_seconds [ALPHA] Duration in seconds of node startup after registration.
# TYPE kubelet_node_startup_post_registration_duration_seconds gauge
kubelet_node_startup_post_registration_duration_seconds 1.5
# HELP kubelet_node_startup_pre_kubelet_duration_seconds [ALPHA] Duration in seconds of node startup before kubelet starts.
# TYPE kubelet_node_startup_pre_kubelet_duration_seconds gauge
kubelet_node_startup_pre_kubelet_duration_seconds 3690
# HELP kubelet_node_startup_pre_registration_duration_seconds [ALPHA] Duration in seconds of node startup before registration.
# TYPE kubelet_node_startup_pre_registration_duration_seconds gauge
kubelet_node_startup_pre_registration_duration_seconds 0.75
# HELP kubelet_node_startup_registration_duration_seconds [ALPHA] Duration in seconds of node startup during registration.
# TYPE kubelet_node_startup_registration_duration_seconds gauge
kubelet_node_startup_registration_duration_seconds 20
# HELP kubelet_pod_start_duration_seconds [ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run
# TYPE kubelet_pod_start_duration_seconds histogram
kubelet_pod_start_duration_seconds_bucket{le="0.5"} 0
kubelet_pod_start_duration_seconds_sum 0
process_start_time_seconds 1.76e+09
`

func TestParseStartupMetrics(t *testing.T) {
	// The names as the kubelet's source spells them, written out here
	// rather than taken from kubeletStartupMetrics, so that a wrong name
	// there fails.
	want := map[string]float64{
		"kubelet_node_startup_pre_kubelet_duration_seconds":       3690,
		"kubelet_node_startup_pre_registration_duration_seconds":  0.75,
		"kubelet_node_startup_registration_duration_seconds":      20,
		"kubelet_node_startup_post_registration_duration_seconds": 1.5,
		"kubelet_node_startup_duration_seconds":                   3712.25,
	}
	if len(kubeletStartupMetrics) != len(want) {
		t.Errorf("kubeletStartupMetrics has %d names, want the kubelet's %d", len(kubeletStartupMetrics), len(want))
	}
	got, err := parseStartupMetrics(startupMetricsText)
	if err != nil {
		t.Fatalf("parseStartupMetrics: %v", err)
	}
	for n, v := range want {
		if g, ok := got[n]; !ok || g != v {
			t.Errorf("%s = %v (present: %v), want %v", n, g, ok, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("parsed %v, want only %v", got, want)
	}

	// One gauge missing (a kubelet of another version): an error naming it.
	text := strings.Replace(startupMetricsText, "\nkubelet_node_startup_registration_duration_seconds 20\n", "\n", 1)
	if _, err := parseStartupMetrics(text); err == nil || !strings.Contains(err.Error(), "kubelet_node_startup_registration_duration_seconds") {
		t.Errorf("without the registration gauge: err %v, want one naming it", err)
	}
	// A value that is not a number.
	text = strings.Replace(startupMetricsText, "post_registration_duration_seconds 1.5", "post_registration_duration_seconds soon", 1)
	if _, err := parseStartupMetrics(text); err == nil {
		t.Error("a gauge whose value is not a number: no error")
	}
}
