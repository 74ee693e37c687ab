package readiness

import (
	"context"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// FromDaemon is the Node as the daemon's live watch last saw it
// (/run/unbounded/node.json, lib/noderecord), for the binaries without a
// TLS client. It is not known (and counts for nothing) without a record
// (the watch is not live: the cluster is not reachable, or the daemon's
// credential may not read the Node), while the daemon does not run (a
// record it left behind is not current), when the Node does not exist
// (registering it is the kubelet's; a Node that was Ready and vanished
// is the daemon's to repave), and for a Ready record without a heartbeat
// (one written by an older daemon).
func FromDaemon(p hostpaths.Paths, u Units) NodeSource {
	return func(ctx context.Context) (Node, error) {
		if st, err := u.ActiveState(ctx, unitnames.Daemon); err != nil || st != "active" {
			return Node{}, nil
		}
		rec, err := noderecord.Read(p)
		if err != nil || rec == nil || !rec.Present || (rec.Ready && rec.Heartbeat.IsZero()) {
			return Node{}, nil
		}
		return Node{
			Known: true, Present: true, Ready: rec.Ready,
			Status: rec.Status, Reason: rec.Reason, Message: rec.Message,
			Heartbeat: rec.Heartbeat, Transition: rec.Transition,
		}, nil
	}
}
