package model

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// recorder is a fake proxy.Dataplane for one family. It keeps the latest snapshot and, like a dataplane
// doing partial syncs, maintains its own copy of the Service ports updated only through
// Snapshot.Changes; after every Apply that copy must equal the snapshot (same ports, same pointers), every
// port Changes lists must really have changed, and ports it keeps must not have been modified in place.
type recorder struct {
	family v1.IPFamily

	mu sync.Mutex
	// last is the last snapshot applied; view is the incremental copy of its ports; seen holds, per port
	// pointer kept in view, the portView it had when first applied (to detect in-place modification).
	last    *proxy.Snapshot
	view    map[proxy.ServicePortName]*proxy.ServicePort
	seen    map[*proxy.ServicePort]portView
	applies int
	full    int
	changed int
	errs    []string
}

var _ proxy.Dataplane = (*recorder)(nil)

func newRecorder(family v1.IPFamily) *recorder {
	return &recorder{
		family: family,
		view:   map[proxy.ServicePortName]*proxy.ServicePort{},
		seen:   map[*proxy.ServicePort]portView{},
	}
}

// Reconfigure, Watch and Stop implement proxy.Dataplane: the model never reloads, watches or drains.
func (r *recorder) Reconfigure(*config.KubeProxyConfiguration) error      { return nil }
func (r *recorder) Watch(context.Context, time.Duration, func(full bool)) {}
func (r *recorder) Stop(context.Context)                                  {}

// Apply implements proxy.Dataplane. It never fails: the checks are recorded and read with Errors.
func (r *recorder) Apply(_ context.Context, snap *proxy.Snapshot, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applies++
	if full {
		r.full++
	}
	fail := func(format string, args ...any) {
		if len(r.errs) < 50 {
			r.errs = append(r.errs, fmt.Sprintf("%s apply #%d (generation %d): ", r.family, r.applies, snap.Generation)+fmt.Sprintf(format, args...))
		}
	}
	if snap.Family != r.family {
		fail("snapshot of family %s", snap.Family)
	}
	if r.last != nil && snap.Generation <= r.last.Generation {
		fail("generation did not increase from %d", r.last.Generation)
	}

	changes := snap.Changes(r.last)
	r.changed += len(changes)
	for i, name := range changes {
		if i > 0 && changes[i-1].Compare(name) >= 0 {
			fail("Changes not sorted and unique: %v before %v", changes[i-1], name)
		}
		now, inNow := snap.Services[name]
		var before *proxy.ServicePort
		inBefore := false
		if r.last != nil {
			before, inBefore = r.last.Services[name]
		}
		if inNow == inBefore && now == before {
			fail("Changes lists %v, which did not change", name)
		}
		if inNow {
			r.view[name] = now
		} else {
			delete(r.view, name)
		}
	}

	// The incremental copy must now be the snapshot.
	if len(r.view) != len(snap.Services) {
		fail("incremental view has %d ports, snapshot %d", len(r.view), len(snap.Services))
	}
	for name, sp := range snap.Services {
		if got, ok := r.view[name]; !ok {
			fail("incremental view lacks %v (Changes missed an addition)", name)
		} else if got != sp {
			fail("incremental view holds a stale %v (Changes missed a modification)", name)
		}
	}
	for name := range r.view {
		if _, ok := snap.Services[name]; !ok {
			fail("incremental view still holds %v (Changes missed a removal)", name)
			delete(r.view, name)
		}
	}
	r.view = make(map[proxy.ServicePortName]*proxy.ServicePort, len(snap.Services))
	for name, sp := range snap.Services {
		r.view[name] = sp
	}

	// Shared ports are immutable: a port kept from an earlier snapshot must still say what it said.
	live := make(map[*proxy.ServicePort]portView, len(snap.Services))
	for _, sp := range snap.Services {
		pv := portViewOf(sp)
		if old, ok := r.seen[sp]; ok && !reflect.DeepEqual(old, pv) {
			fail("port %v was modified in place after it was applied", sp.Name)
		}
		live[sp] = pv
	}
	r.seen = live
	r.last = snap
	return nil
}

// Latest returns the last snapshot applied (nil before the first).
func (r *recorder) Latest() *proxy.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Errors returns the consistency violations seen so far.
func (r *recorder) Errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// Counts returns the number of Apply calls, how many were full, and the total length of Changes.
func (r *recorder) Counts() (applies, full, changed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applies, r.full, r.changed
}
