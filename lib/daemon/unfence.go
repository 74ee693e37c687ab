package daemon

import (
	"context"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	fencerecord "unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// unfenceState remembers which Machine generation the node was started
// for, so that each change of the Machine's spec gets one new start and
// the fence's own status writes (which do not change the generation) get
// none.
type unfenceState struct {
	uid      types.UID
	gen      int64
	starting atomic.Bool
}

// unfence starts the node when the last fence check of this boot refused
// explicitly (lib/fence/record) and the Machine, as the watch shows it
// now, no longer refuses: it binds the allocation the check was made for,
// is not fenced and is not being deleted. The start runs the fence again
// (unbounded-fence.service is Required by the node units): the daemon
// judges only whether asking again is worth it, the fence decides. So
// nothing starts the node without a fence that allowed it, and the node
// comes back within seconds of the change, also of one made while the
// daemon was down (the first list counts as a change).
//
// A refusal the Machine cannot show (a revoked token, a rejected
// certificate) is asked again once per change of the Machine's spec, and
// once per start of the daemon; a refusal for lack of an answer is
// unbounded-health's to retry, not this.
func (d *daemon) unfence(ctx context.Context) {
	m := d.machineObj
	if m == nil || m.DeletionTimestamp != nil {
		return
	}
	rec, err := fencerecord.Read(d.p)
	if err != nil {
		d.log.Warn("fence record unreadable", "error", err)
		return
	}
	if rec == nil || rec.Outcome != fencerecord.Refused || !machineAllows(m, rec.AllocationUID) {
		return
	}
	if active, err := state.ReadActive(d.p); err != nil || active == nil {
		// No node to start: a first boot refused by its fence is
		// finished by bootstrap's next run, not by the node target
		// (which the generator links to nothing on such a host).
		return
	}
	u := &d.unfenceState
	if u.uid == m.UID && u.gen == m.Generation {
		return // asked already for this spec
	}
	if !u.starting.CompareAndSwap(false, true) {
		return // a start is on its way; the next Machine change asks again
	}
	u.uid, u.gen = m.UID, m.Generation
	d.log.Info("the Machine no longer refuses what the fence refused; starting the node, which runs the fence again",
		"refused", rec.Reason, "generation", m.Generation)
	go func() {
		defer u.starting.Store(false)
		res, err := d.sd.StartUnit(ctx, unitnames.NodeTarget)
		switch {
		case err != nil:
			d.log.Warn("start of the node after the fence's refusal", "unit", unitnames.NodeTarget, "error", err)
		case res != "done":
			d.log.Warn("the node did not start after the fence's refusal (see unbounded-fence.service)", "unit", unitnames.NodeTarget, "result", res)
		default:
			d.log.Info("node started after the fence's refusal was lifted", "unit", unitnames.NodeTarget)
		}
	}()
}

// machineAllows is the fence's judgement of a Machine (lib/fence's judge)
// without its reasons: bound to allocation uid, not fenced, not deleting.
func machineAllows(m *v1alpha3.Machine, uid string) bool {
	a := m.Spec.Allocation
	return m.DeletionTimestamp == nil && uid != "" && a != nil && a.UID == uid && !a.Fenced
}
