package ipvs

import (
	"net/netip"
	"slices"

	"kube-proxy/proxy"
)

// desired is the kernel state that all Service ports together want. It is kept incrementally: a port's
// desired state is added or removed as a whole, and what ports share (set entries, bound addresses) is reference
// counted, so a partial sync costs in proportion to what changed.
type desired struct {
	ports map[proxy.ServicePortName]*portDesired
	// claims lists, per virtual server, the ports that want it, sorted by port name. Normally there is one;
	// when two Services claim the same address and port (a conflict the apiserver does not prevent for
	// external IPs), the first by name wins, deterministically.
	claims       map[vsKey][]claim
	binds        map[netip.Addr]int
	sets         [numSets]map[entry]int
	noNodeAccess map[entry]int
}

type claim struct {
	owner proxy.ServicePortName
	vs    *virtualServer
}

func newDesired() *desired {
	d := &desired{
		ports:        map[proxy.ServicePortName]*portDesired{},
		claims:       map[vsKey][]claim{},
		binds:        map[netip.Addr]int{},
		noNodeAccess: map[entry]int{},
	}
	for i := range d.sets {
		d.sets[i] = map[entry]int{}
	}
	return d
}

// touched records what a change of ports' desired states may have changed in the kernel state. For set members it also
// records whether each was wanted before the change: a partial sync follows a successful one, so that is
// what the kernel holds, and no copy of the kernel's sets is kept.
type touched struct {
	vs    map[vsKey]struct{}
	binds map[netip.Addr]struct{}
	sets  [numSets]map[entry]bool // wanted before
}

func newTouched() *touched {
	t := &touched{vs: map[vsKey]struct{}{}, binds: map[netip.Addr]struct{}{}}
	for i := range t.sets {
		t.sets[i] = map[entry]bool{}
	}
	return t
}

// set replaces the desired state of one port (nil removes it), recording what it touched in t (which may be nil).
func (d *desired) set(name proxy.ServicePortName, p *portDesired, t *touched) {
	if old := d.ports[name]; old != nil {
		d.apply(name, old, -1, t)
		delete(d.ports, name)
	}
	if p != nil {
		d.ports[name] = p
		d.apply(name, p, +1, t)
	}
}

func (d *desired) apply(name proxy.ServicePortName, p *portDesired, delta int, t *touched) {
	for _, vs := range p.vss {
		cl := d.claims[vs.key]
		i, found := slices.BinarySearchFunc(cl, name, func(c claim, n proxy.ServicePortName) int { return c.owner.Compare(n) })
		switch {
		case delta > 0 && !found:
			cl = slices.Insert(cl, i, claim{name, vs})
		case delta > 0:
			cl[i].vs = vs // the same port claiming one address twice: keep the last
		case found:
			cl = slices.Delete(cl, i, i+1)
		}
		if len(cl) == 0 {
			delete(d.claims, vs.key)
		} else {
			d.claims[vs.key] = cl
		}
		if t != nil {
			t.vs[vs.key] = struct{}{}
		}
	}
	for _, a := range p.binds {
		if count(d.binds, a, delta) && t != nil {
			t.binds[a] = struct{}{}
		}
	}
	for _, se := range p.entries {
		if count(d.sets[se.set], se.e, delta) && t != nil {
			if _, seen := t.sets[se.set][se.e]; !seen {
				t.sets[se.set][se.e] = delta < 0 // it disappeared, so it was there
			}
		}
	}
	for _, e := range p.noNodeAccess {
		count(d.noNodeAccess, e, delta) // the rules that use these are compared whole, not tracked
	}
}

// count adds delta to m[k], deleting it at zero; it reports whether k appeared or disappeared.
func count[K comparable](m map[K]int, k K, delta int) bool {
	n := m[k] + delta
	if n <= 0 {
		delete(m, k)
		return n+(-delta) > 0
	}
	m[k] = n
	return n == delta
}

// vs returns the virtual server wanted at k, or nil.
func (d *desired) vs(k vsKey) *virtualServer {
	if cl := d.claims[k]; len(cl) > 0 {
		return cl[0].vs
	}
	return nil
}

// nonEmpty reports which sets have members, for the iptables rules that only exist for non-empty sets.
func (d *desired) nonEmpty() (out [numSets]bool) {
	for i := range d.sets {
		out[i] = len(d.sets[i]) > 0
	}
	return out
}

// sortedNoNodeAccess returns the load-balancer entries the node must not reach, sorted.
func (d *desired) sortedNoNodeAccess() []entry {
	out := make([]entry, 0, len(d.noNodeAccess))
	for e := range d.noNodeAccess {
		out = append(out, e)
	}
	slices.SortFunc(out, entry.compare)
	return out
}
