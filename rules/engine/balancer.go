package engine

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// balancer picks endpoints: round-robin, or the client's previous endpoint under ClientIP affinity.
type balancer struct {
	mu        sync.Mutex
	endpoints []netip.AddrPort
	next      int
	affinity  time.Duration
	sticky    map[netip.Addr]stickyEntry
	lastSweep time.Time
}

type stickyEntry struct {
	ep   netip.AddrPort
	used time.Time
}

// set replaces the target. Affinity entries for endpoints no longer present are dropped.
func (b *balancer) set(t Target) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.endpoints = slices.Clone(t.Endpoints)
	if b.next >= len(b.endpoints) {
		b.next = 0
	}
	b.affinity = t.Affinity
	if b.affinity <= 0 {
		b.sticky = nil
		return
	}
	if b.sticky == nil {
		b.sticky = map[netip.Addr]stickyEntry{}
	}
	for ip, s := range b.sticky {
		if !slices.Contains(b.endpoints, s.ep) {
			delete(b.sticky, ip)
		}
	}
}

// has reports whether ep is one of the current endpoints.
func (b *balancer) has(ep netip.AddrPort) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Contains(b.endpoints, ep)
}

// order returns the endpoints to try for a client, first choice first, each once; empty when there are
// none.
func (b *balancer) order(client netip.Addr, now time.Time) []netip.AddrPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.endpoints)
	if n == 0 {
		return nil
	}
	start := -1
	if b.affinity > 0 {
		if s, ok := b.sticky[client]; ok && now.Sub(s.used) < b.affinity {
			start = slices.Index(b.endpoints, s.ep)
		}
	}
	if start < 0 {
		start = b.next
		b.next = (b.next + 1) % n
	}
	out := make([]netip.AddrPort, 0, n)
	for i := range n {
		out = append(out, b.endpoints[(start+i)%n])
	}
	return out
}

// used records that client reached ep (for affinity) and expires old affinity entries now and then.
func (b *balancer) used(client netip.Addr, ep netip.AddrPort, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.affinity <= 0 {
		return
	}
	b.sticky[client] = stickyEntry{ep: ep, used: now}
	if now.Sub(b.lastSweep) >= b.affinity {
		b.lastSweep = now
		for ip, s := range b.sticky {
			if now.Sub(s.used) >= b.affinity {
				delete(b.sticky, ip)
			}
		}
	}
}

// forget drops client's affinity to ep (it could not be reached).
func (b *balancer) forget(client netip.Addr, ep netip.AddrPort) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.sticky[client]; ok && s.ep == ep {
		delete(b.sticky, client)
	}
}
