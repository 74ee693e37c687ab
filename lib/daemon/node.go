package daemon

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/noderecord"
)

// The Node's Ready condition, handed to unbounded-health through
// /run/unbounded/node.json (lib/noderecord): health has no Kubernetes
// client (ARCHITECTURE section 3), and the daemon already watches the Node.
//
// The file is written only when the Ready condition changes, its heartbeat
// among it (Node updates that leave the condition alone write nothing;
// the kubelet writes it at its start, on a change, else every 5 min), so
// that the idle daemon stays about idle, and it is removed whenever
// the watch is not live: then health counts nothing, since the cluster's
// view is not known.

// nodeRecord is the loop's view of the Node watch (owned by the loop).
type nodeRecord struct {
	live    bool         // the watch is listed and running
	obj     *corev1.Node // the Node as last seen (nil: absent)
	written *noderecord.Record
}

// seeNode takes the Node (nil: absent) from a list or an event of a live
// watch.
func (d *daemon) seeNode(n *corev1.Node) {
	d.nodeRec.live, d.nodeRec.obj = true, n
	d.writeNodeRecord()
}

// nodeWatchLive records that the Node watch failed (live false) or works
// again (live true) without a new list.
func (d *daemon) nodeWatchLive(live bool) {
	if d.nodeRec.live == live {
		return
	}
	d.nodeRec.live = live
	if !live {
		d.log.Info("Node watch not live; the Node's Ready condition is no longer recorded for health", "file", noderecord.File(d.p))
	}
	d.writeNodeRecord()
}

// forgetNode removes the record: the Node is no longer followed (no live
// Machine, or the daemon stops or starts).
func (d *daemon) forgetNode() {
	d.nodeRec.live, d.nodeRec.obj = false, nil
	d.writeNodeRecord()
}

func (d *daemon) writeNodeRecord() {
	var want *noderecord.Record
	if d.nodeRec.live {
		want = nodeRecordOf(d.node, d.nodeRec.obj, d.host.now())
	}
	if want.Same(d.nodeRec.written) {
		return
	}
	if want == nil {
		if err := noderecord.Remove(d.p); err != nil {
			d.log.Warn("cannot remove the Node record", "file", noderecord.File(d.p), "error", err)
			return
		}
		d.nodeRec.written = nil
		return
	}
	if err := noderecord.Write(d.p, *want); err != nil {
		d.log.Warn("cannot record the Node's Ready condition for health", "file", noderecord.File(d.p), "error", err)
		return
	}
	d.nodeRec.written = want
}

func nodeRecordOf(name string, n *corev1.Node, now time.Time) *noderecord.Record {
	r := &noderecord.Record{Node: name, Since: now.UTC()}
	if n == nil {
		return r
	}
	st := kube.Readiness(n)
	r.Present, r.Ready = true, st.Ready
	r.Status, r.Reason, r.Message = st.Status, st.Reason, st.Message
	if st.Status != "" {
		r.Transition, r.Heartbeat = st.Transition.UTC(), st.Heartbeat.UTC()
	}
	return r
}
