// Package syncstate is the bookkeeping every mode's Apply repeats around its own work: whether the next
// sync must be full, which reconfiguration a sync began under (so that one reconfigured meanwhile does not
// clear the need for a full sync), and the snapshot the last successful sync applied, which partial syncs
// diff against. It also runs the conntrack cleanup that follows a successful sync in modes iptables, ipvs
// and nftables, and logs and counts what someone else changed behind a mode's back.
//
// A sync goes:
//
//	s := st.Begin()              // full needed until this sync succeeds
//	... write, full when s.Full (or the mode wants it), diffing against s.Last ...
//	st.Succeeded(s, snap)        // records snap; clears full-needed unless reconfigured or marked since Begin
//
// A failed sync just returns: the next one is full.
package syncstate

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
)

// State is one dataplane's sync state; its zero value is ready and asks for a full first sync. It is safe
// for concurrent use. Its lock is a leaf: no method calls out while holding it, so a mode may call it with
// any of its own locks held. A mode whose configuration is guarded by its own lock calls Reconfigured and
// Begin with that lock held, so that the generation a sync begins under is that of the configuration it
// read.
type State struct {
	mu sync.Mutex
	// full: the next sync must be full (besides when none succeeded yet).
	full bool
	// gen counts reconfigurations, marks the MarkFull calls: a sync that began before either does not
	// clear full.
	gen, marks uint64
	last       *proxy.Snapshot
}

// Sync is what a sync begins with.
type Sync struct {
	// Full reports that the state asks for a full sync: none has succeeded yet, the last one failed, or the
	// dataplane was reconfigured (Reconfigured) or marked (MarkFull) since.
	Full bool
	// Last is the snapshot the last successful sync applied, nil before the first one.
	Last *proxy.Snapshot

	gen, marks uint64
}

// Begin starts a sync: it reports what the sync needs, and asks for a full sync until this one succeeds.
func (st *State) Begin() Sync {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := Sync{Full: st.full || st.last == nil, Last: st.last, gen: st.gen, marks: st.marks}
	st.full = true // until this sync succeeds
	return s
}

// Succeeded records that the sync s applied snap. It clears the need for a full sync unless the dataplane
// was reconfigured or marked since s began, and reports whether the configuration is still the one s
// began under (what Current reports).
func (st *State) Succeeded(s Sync, snap *proxy.Snapshot) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.last = snap
	current := st.gen == s.gen
	if current && st.marks == s.marks {
		st.full = false
	}
	return current
}

// Current reports whether the dataplane was not reconfigured since s began.
func (st *State) Current(s Sync) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.gen == s.gen
}

// Reconfigured records a change of configuration: the next sync is full, and a sync under way does not
// clear that when it succeeds.
func (st *State) Reconfigured() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.gen++
	st.full = true
}

// ReconfiguredPartial records a change of configuration that the next sync can apply without being full
// (the mode has its own way of catching up, as nftables' compare-every-Service partial sync); a sync under
// way, which may have read the old configuration, leaves the next sync full.
func (st *State) ReconfiguredPartial() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.gen++
}

// MarkFull makes the next sync full (our rules were found removed, say); a sync under way does not clear
// that when it succeeds.
func (st *State) MarkFull() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.marks++
	st.full = true
}

// Synced reports whether the last sync succeeded and nothing asked for a full one since: whether the
// kernel holds what the dataplane believes it wrote, so that a difference found there was made by someone
// else. It is false while a sync is under way.
func (st *State) Synced() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last != nil && !st.full
}

// Last returns the snapshot the last successful sync applied, nil before the first one.
func (st *State) Last() *proxy.Snapshot {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last
}

// Cleaner removes stale conntrack entries after a sync (a *conntrack.Cleaner).
type Cleaner interface {
	Clean(snap *proxy.Snapshot) error
}

// CleanConntrack runs c (nil: nothing to do) after a successful sync of snap when the sync was full (in
// the mode's sense) or changed a UDP or SCTP Service port (conntrack.Affected). A failure is logged, not
// returned: the rules are written, and stale flows only linger until they time out.
func CleanConntrack(c Cleaner, family v1.IPFamily, snap *proxy.Snapshot, full bool, changed []proxy.ServicePortName) {
	if c == nil || !full && !conntrack.Affected(changed) {
		return
	}
	if err := c.Clean(snap); err != nil {
		klog.ErrorS(err, "Conntrack cleanup failed; stale UDP/SCTP flows may linger until they time out", "ipFamily", family)
	}
}

// ChangedExternally logs and counts (in counter, the mode's metric) one finding that someone else changed
// what a mode wrote for family, which the mode restores with a full sync: rules names the mode's kernel
// state ("iptables rules", "nftables table"), change what was found.
func ChangedExternally(counter prometheus.Counter, family v1.IPFamily, rules, change string) {
	klog.InfoS("Kube-proxy's rules were changed behind our back; a full sync restores them", "ipFamily", family, "rules", rules, "change", change)
	counter.Inc()
}
