package daemon

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/backoff"
	"unbounded-cloud.io/agent/lib/kube"
)

// At idle the daemon holds its three watches and sends nothing else: no
// resync, no polling, no lease. Why not client-go informers: a reflector
// ends its watch every 5 to 10 minutes on its own (a random timeoutSeconds)
// and re-establishes it, and an informer with a resync period re-delivers
// everything. This loop asks for no timeout, so a watch lasts as long as
// the API server lets it (--min-request-timeout, 30 to 60 minutes by
// default), and resumes from the last resource version it saw, which
// bookmarks keep current, so that a resumed watch needs no new list. A list
// happens at start and after the server says the version is too old (410
// Gone).

type listFunc func(ctx context.Context) (objs []any, rv string, err error)
type watchFunc func(ctx context.Context, rv string) (watch.Interface, error)

const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 30 * time.Second
	// forbiddenBackoff is the pause after a 403 or 401.
	forbiddenBackoff = 10 * time.Minute
)

func (d *daemon) watchLoop(ctx context.Context, k kind, list listFunc, watchFn watchFunc) {
	// delay is the next wait: lib/backoff's doubling from minBackoff
	// to maxBackoff over the failures in a row (the forbidden pause once).
	delay, failures := minBackoff, 0
	wait := func() bool {
		if backoff.Sleep(ctx, delay) != nil {
			return false
		}
		failures++
		delay = backoff.Doubling(minBackoff, maxBackoff, failures+1)
		return true
	}
	// down: this loop told the daemon its watch failed (sent only once
	// per failure, and only until it works again: no traffic at idle).
	down := false
	markDown := func() bool {
		if down || ctx.Err() != nil {
			return true
		}
		down = true
		return d.send(ctx, update{kind: k, watchDown: true})
	}
	for ctx.Err() == nil {
		objs, rv, err := list(ctx)
		if err != nil {
			if !markDown() {
				return
			}
			if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				// Not a blip: this credential may not read it (the
				// bootstrap token may not read the Node). Asking again
				// every 30 seconds would make an idle daemon busy; a
				// new credential restarts the watches anyway.
				delay = forbiddenBackoff
			}
			if ctx.Err() == nil {
				d.logRetry(k, "list failed; retrying", "kind", k, "error", err, "in", delay)
			}
			if !wait() {
				return
			}
			continue
		}
		if !d.send(ctx, update{kind: k, sync: true, objs: objs}) {
			return
		}
		down = false // the list says it all
		for ctx.Err() == nil {
			w, err := watchFn(ctx, rv)
			if err != nil {
				if kube.Expired(err) {
					break
				}
				if !markDown() {
					return
				}
				if ctx.Err() == nil {
					d.logRetry(k, "watch failed; retrying", "kind", k, "error", err, "in", delay)
				}
				if !wait() {
					return
				}
				continue
			}
			if down {
				if !d.send(ctx, update{kind: k, watchUp: true}) {
					w.Stop()
					return
				}
				down = false
			}
			newRV, gone, got := d.consume(ctx, k, w)
			w.Stop()
			if newRV != "" {
				rv = newRV
			}
			if got {
				delay, failures = minBackoff, 0
			}
			if gone {
				break
			}
			if !got && !wait() {
				// A watch that ends before delivering anything is
				// retried with a growing delay, never in a tight loop.
				return
			}
		}
	}
}

// consume forwards one watch's events until it ends; it returns the last
// resource version seen, whether the server said that version is gone,
// and whether anything arrived at all. An error event is not progress: a
// server that answers every watch with one is retried with the growing
// delay, not in a tight loop.
func (d *daemon) consume(ctx context.Context, k kind, w watch.Interface) (rv string, gone, got bool) {
	for {
		select {
		case <-ctx.Done():
			return rv, false, got
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, false, got
			}
			switch ev.Type {
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				if kube.Expired(err) {
					return rv, true, got
				}
				d.log.Warn("watch error; re-watching", "kind", k, "error", err)
				return rv, false, got
			case watch.Bookmark:
				got = true
				if m, err := meta.Accessor(ev.Object); err == nil {
					rv = m.GetResourceVersion()
				}
			case watch.Added, watch.Modified, watch.Deleted:
				got = true
				m, err := meta.Accessor(ev.Object)
				if err != nil {
					continue
				}
				rv = m.GetResourceVersion()
				if !d.send(ctx, update{kind: k, deleted: ev.Type == watch.Deleted, objs: []any{ev.Object}}) {
					return rv, false, got
				}
			}
		}
	}
}

// logRetry logs a failed list or watch: a warning, except for the Machine's
// own watch while no Machine lives, whose failures (a retired host's
// credentials may be revoked) are expected and logged at debug level, so
// that a retired host's daemon stays quiet.
func (d *daemon) logRetry(k kind, msg string, args ...any) {
	if k == kindMachine && d.idle.Load() {
		d.log.Debug(msg, args...)
		return
	}
	d.log.Warn(msg, args...)
}

// genKey carries the following generation of a Node or operations watch
// in its context (see followMachine); send stamps it on every update.
type genKey struct{}

func (d *daemon) send(ctx context.Context, u update) bool {
	u.gen, _ = ctx.Value(genKey{}).(int)
	select {
	case d.updates <- u:
		return true
	case <-ctx.Done():
		return false
	}
}

func (d *daemon) listMachine(ctx context.Context) ([]any, string, error) {
	out := &v1alpha3.MachineList{}
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", d.machine).String()}
	err := d.cluster.ops.Get().Resource(v1alpha3.ResourceMachines).
		VersionedParams(&opts, opParameterCodec).Do(ctx).Into(out)
	if err != nil {
		return nil, "", err
	}
	return pointers(out.Items), out.ResourceVersion, nil
}

func (d *daemon) watchMachine(ctx context.Context, rv string) (watch.Interface, error) {
	return d.cluster.machines.Watch(ctx, d.machine, rv)
}

func (d *daemon) listNode(ctx context.Context) ([]any, string, error) {
	out, err := d.cluster.listNodes(ctx, d.node)
	if err != nil {
		return nil, "", err
	}
	return pointers(out.Items), out.ResourceVersion, nil
}

func (d *daemon) watchNode(ctx context.Context, rv string) (watch.Interface, error) {
	return d.cluster.watchNodes(ctx, d.node, rv)
}

func (d *daemon) listOps(ctx context.Context) ([]any, string, error) {
	out, err := d.cluster.listOps(ctx, d.machine)
	if err != nil {
		return nil, "", err
	}
	return pointers(out.Items), out.ResourceVersion, nil
}

func (d *daemon) watchOps(ctx context.Context, rv string) (watch.Interface, error) {
	return d.cluster.watchOps(ctx, d.machine, rv)
}

// pointers returns a pointer to each item of a list, as the watch loop
// handles objects.
func pointers[T any](items []T) []any {
	objs := make([]any, 0, len(items))
	for i := range items {
		objs = append(objs, &items[i])
	}
	return objs
}
