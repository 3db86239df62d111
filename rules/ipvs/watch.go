package ipvs

import (
	"context"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

// Stop does nothing: the kernel's IPVS carries the traffic, and the virtual servers stay when the daemon
// stops.
func (d *Dataplane) Stop(context.Context) {}

// watchRetry is how long the address watch waits before subscribing again after a failure.
var watchRetry = 5 * time.Second

// Watch asks for a full sync as soon as the node's addresses of the family change (an address added to
// or removed from any link but kube-ipvs0), so that NodePorts, externalIPs and load-balancer IPs follow
// the node's addresses without waiting for the periodic sync: only a full sync re-reads them. Upstream's
// IPVS mode reads them at every sync, which is always a full one there.
func (d *Dataplane) Watch(ctx context.Context, _ time.Duration, sync func(full bool)) {
	for {
		err := d.k.links.watchAddrs(ctx, d.family, func() {
			if d.addrsChanged() {
				klog.V(2).InfoS("The node's addresses changed; syncing in full", "ipFamily", d.family)
				sync(true)
			}
		})
		if ctx.Err() != nil {
			return
		}
		// Changes may have been missed: look again once subscribed.
		klog.ErrorS(err, "Watching the node's addresses; trying again", "ipFamily", d.family, "retryIn", watchRetry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(watchRetry):
		}
		if d.addrsChanged() {
			sync(true)
		}
	}
}

// addrsChanged reports whether the node's addresses of the family (all links but kube-ipvs0) differ from
// those the last full sync rendered with. Before the first full sync there is nothing to compare.
func (d *Dataplane) addrsChanged() bool {
	addrs, err := d.k.links.localAddrs(d.family, DummyLink)
	if err != nil {
		return true // let a full sync find out
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	last := d.state.Last()
	if last == nil {
		return false
	}
	return !slices.Equal(newEnv(&d.cfg, &last.Node, addrs).local, d.en.local)
}
