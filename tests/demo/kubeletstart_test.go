//go:build demo

package demo_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/tests/system/harness"
)

// csinodeRestartLine begins the line the ready wait logs when it restarts
// the node stack because the kubelet's CSINode is not initialized
// (lib/bootstrap ready; bootstrap's own wait and repave's, through
// WaitReady).
const csinodeRestartLine = "the kubelet's CSINode is not initialized"

// csinodeRestarts counts the ready wait's node stack restarts in lines.
func csinodeRestarts(lines []journalLine) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l.msg, csinodeRestartLine) {
			n++
		}
	}
	return n
}

// kubeletStart adds to the bench file, under prefix, once node is Ready:
// the CSINode restarts of unit's run since since, and the kubelet's own
// startup gauges (kubeletStartupMetrics), which say where its start went
// as the agent's phases cannot. They are read through the API server's
// node proxy: the host's kubelet port is published to the test control
// plane (nodestack.NewFirstBootHost, kubeenv.PublishKubelet), and the
// port is the host's in both modes, so the proxy reaches whichever
// kubelet runs now. Without a bench file it does nothing, as the reading
// may wait. A reading that fails is shown and noted in the bench file,
// not fatal: the rest of the bench still counts.
func (b *benchOut) kubeletStart(t *testing.T, ctx context.Context, o *out, kube kubernetes.Interface, m *harness.Machine, prefix, node, unit string, since time.Time) {
	t.Helper()
	if b.path == "" {
		return
	}
	restarts := csinodeRestarts(unitJournal(t, m, unit, since))
	b.lines = append(b.lines, fmt.Sprintf("%s.csinode-restarts %d", prefix, restarts))

	const post = "kubelet_node_startup_post_registration_duration_seconds"
	var got map[string]float64
	var lastErr error
	// The kubelet sets the post-registration gauge (and the total) right
	// after the status update that made its Node Ready, so a reading may
	// just precede it. A kubelet that found its Node registered already
	// (the one a CSINode restart started) sets none of the gauges: they
	// stay 0, and only a kubelet that creates its Node sets them.
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics").DoRaw(ctx)
		if err != nil {
			lastErr = fmt.Errorf("GET /api/v1/nodes/%s/proxy/metrics: %w", node, err)
			return false, nil
		}
		g, err := parseStartupMetrics(string(raw))
		if err != nil {
			lastErr = fmt.Errorf("the kubelet's /metrics: %w", err)
			return false, nil
		}
		got, lastErr = g, nil
		return restarts > 0 || g[post] > 0, nil
	})
	if got == nil {
		if lastErr == nil {
			lastErr = err
		}
		o.say("%s: the kubelet's startup metrics not read: %v", prefix, lastErr)
		b.lines = append(b.lines, prefix+".kubelet-metrics.failed 1")
		return
	}
	for _, n := range kubeletStartupMetrics {
		b.lines = append(b.lines, fmt.Sprintf("%s.%s %.3f", prefix, n, got[n]))
	}
	// pre_kubelet and the total both count from the kernel's boot, which
	// a container shares with the machine that runs it; their
	// difference is the kubelet's own start to its Node Ready.
	o.say("%s: the kubelet's own start (its metrics): before registration %.1fs, registration %.1fs, after registration to Node Ready %.1fs; its start -> Node Ready %.1fs; CSINode restarts of the node stack: %d",
		prefix,
		got["kubelet_node_startup_pre_registration_duration_seconds"],
		got["kubelet_node_startup_registration_duration_seconds"],
		got[post],
		got["kubelet_node_startup_duration_seconds"]-got["kubelet_node_startup_pre_kubelet_duration_seconds"],
		restarts)
}
