package health

import (
	"context"
	"fmt"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// NodeReady returns an error when the cluster reports the Node not Ready,
// as the daemon's live watch of it last saw (/run/unbounded/node.json),
// and nil when it is Ready or when that is not known: no record (the
// daemon's watch is not live: the cluster is not reachable, or the
// daemon's credential may not read the Node), the daemon not running (a
// record it left behind is not current), or no Node (registering it is
// the kubelet's, and a Node that was Ready and vanished is the daemon's
// to repave).
//
// Health reads a file rather than the API server: a TLS client alone
// would put this binary over its 5 MB budget (ARCHITECTURE section 3),
// and the daemon already watches the Node.
func NodeReady(ctx context.Context, p hostpaths.Paths, sd Units) error {
	if st, err := sd.ActiveState(ctx, unitnames.Daemon); err != nil || st != "active" {
		return nil
	}
	rec, err := noderecord.Read(p)
	if err != nil || rec == nil || !rec.Present || rec.Ready {
		return nil
	}
	status := rec.Status
	if status == "" {
		status = "not reported"
	}
	msg := fmt.Sprintf("Node %s is not Ready (Ready %s, reason %s", rec.Node, status, orNone(rec.Reason))
	if rec.Message != "" {
		msg += ": " + truncate(rec.Message, 200)
	}
	msg += ")"
	if !rec.Transition.IsZero() {
		msg += " since " + rec.Transition.UTC().Format(time.RFC3339)
	}
	return fmt.Errorf("%s", msg)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
