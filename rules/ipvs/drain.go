package ipvs

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

// Draining of terminating real servers: a TCP real server the desired state no longer wants keeps its
// connections with weight 0 until it has none or its deadline passes; the drain goroutine checks them.

// removeReals removes the real servers of k that the desired state no longer wants, or drains those that still
// have connections (TCP only, when draining is on). fresh are the real servers as just read (nil: read
// them if needed).
func (d *Dataplane) removeReals(k vsKey, want *virtualServer, have *modelVS, fresh []kernelReal) []error {
	var errs []error
	draining := d.draining[k]
	var gone []realKey // sorted, as have.reals is
	for _, rw := range have.reals {
		if _, ok := slices.BinarySearchFunc(want.reals, rw.key, realKey.compare); !ok {
			gone = append(gone, rw.key)
		}
	}
	for _, r := range gone {
		if _, ok := draining[r]; ok && have.reals.weight(r) == 0 {
			continue
		}
		if k.proto.gracefulDelete() && d.opts.drainTimeout > 0 {
			if fresh == nil {
				var err error
				if fresh, err = d.k.ipvs.reals(k); err != nil {
					errs = append(errs, fmt.Errorf("listing the real servers of %s: %w", k, err))
					break
				}
			}
			if i := slices.IndexFunc(fresh, func(f kernelReal) bool { return f.key == r }); i >= 0 && fresh[i].active+fresh[i].inactive > 0 {
				if have.reals.weight(r) != 0 {
					if err := d.k.ipvs.updateReal(k, r, 0); err != nil {
						errs = append(errs, fmt.Errorf("draining real server %s of %s: %w", r, k, err))
						continue
					}
					have.reals.set(r, 0)
				}
				if draining == nil {
					draining = map[realKey]time.Time{}
					d.draining[k] = draining
				}
				if _, ok := draining[r]; !ok {
					draining[r] = d.opts.now().Add(d.opts.drainTimeout)
					klog.V(2).InfoS("Draining real server", "virtualServer", k, "realServer", r,
						"connections", fresh[i].active+fresh[i].inactive)
				}
				continue
			}
		}
		if err := d.k.ipvs.removeReal(k, r); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("removing real server %s from %s: %w", r, k, err))
			continue
		}
		have.reals.del(r)
		delete(draining, r)
	}
	if len(draining) == 0 {
		delete(d.draining, k)
	}
	return errs
}

// drainLoop checks the draining real servers until ctx ends.
func (d *Dataplane) drainLoop(ctx context.Context) {
	t := time.NewTicker(d.opts.drainInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.drain()
		}
	}
}

// drain deletes the draining real servers that have no connections left or whose deadline passed.
func (d *Dataplane) drain() {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.opts.now()
	for k, rs := range d.draining {
		fresh, err := d.k.ipvs.reals(k)
		if err != nil {
			klog.ErrorS(err, "Listing draining real servers failed", "virtualServer", k)
			continue
		}
		have := d.have.vs[k]
		for r, deadline := range rs {
			i := slices.IndexFunc(fresh, func(f kernelReal) bool { return f.key == r })
			if i < 0 {
				delete(rs, r)
				if have != nil {
					have.reals.del(r)
				}
				continue
			}
			conns := fresh[i].active + fresh[i].inactive
			if conns > 0 && now.Before(deadline) {
				continue
			}
			if err := d.k.ipvs.removeReal(k, r); err != nil && !isNotExist(err) {
				klog.ErrorS(err, "Removing a drained real server failed", "virtualServer", k, "realServer", r)
				continue
			}
			klog.V(2).InfoS("Removed drained real server", "virtualServer", k, "realServer", r,
				"connections", conns, "timedOut", conns > 0)
			delete(rs, r)
			if have != nil {
				have.reals.del(r)
			}
		}
		if len(rs) == 0 {
			delete(d.draining, k)
		}
	}
}

// Draining returns the real servers currently draining, as "vs -> real" strings, sorted (for tests and
// debugging).
func (d *Dataplane) Draining() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for k, rs := range d.draining {
		for r := range rs {
			out = append(out, k.String()+" -> "+r.String())
		}
	}
	slices.Sort(out)
	return out
}
