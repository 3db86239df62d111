package nftables

import (
	"maps"
	"slices"
	"time"

	"kube-proxy/proxy"
)

// mirror is what the kernel's table holds, as far as the dataplane knows: what its last successful
// transactions wrote. Partial syncs are planned against it, without reading the kernel.
type mirror struct {
	// r and in are the renderer and inputs the table was written with: rendering a port again with them
	// gives what was written for it, so the mirror keeps only the ports.
	r    *renderer
	in   inputs
	base *baseObjects
	// svcs holds every Service port written, as it was written.
	svcs map[proxy.ServicePortName]*proxy.ServicePort
	// elems holds every element of the shared sets and maps with the ports that want it.
	elems map[elemRef]*elemEntry
	// stale holds the per-Service chains flushed because nothing wants them any more, with when: they are
	// deleted a second later (kernels before 6.2 still count a reference from a map element removed in
	// the same transaction).
	stale map[string]time.Time
	// trims holds the chains whose new rules were inserted ahead of old ones (plan.supersede): the old
	// ones, after the first keep, are deleted a second later.
	trims map[string]trim
	// staleSets holds the affinity sets nothing wants any more that old rules left in a chain may still
	// name, with when: they are deleted after those rules.
	staleSets map[string]time.Time
}

// trim is a chain's old rules waiting to be deleted: every rule after the first keep.
type trim struct {
	keep int
	at   time.Time
}

func newMirror() *mirror {
	return &mirror{svcs: map[proxy.ServicePortName]*proxy.ServicePort{}, elems: map[elemRef]*elemEntry{}, stale: map[string]time.Time{},
		trims: map[string]trim{}, staleSets: map[string]time.Time{}}
}

// written returns the objects written for a Service port (nil when it was not).
func (m *mirror) written(name proxy.ServicePortName) *svcObjects {
	sp := m.svcs[name]
	if sp == nil || m.r == nil {
		return nil
	}
	return m.r.service(sp, &m.in)
}

// elemRef names one element of a shared set or map.
type elemRef struct {
	set string
	key elemKey
}

// elemEntry is one element: the ports that want it (in name order; the first one's value is written,
// when several ports claim the same key with different values), and what the kernel holds.
type elemEntry struct {
	owners  []elemOwner
	present bool
	written elemValue
}

type elemOwner struct {
	name  proxy.ServicePortName
	value elemValue
}

// want returns the value the kernel should hold, and whether it should hold the element at all.
func (e *elemEntry) want() (elemValue, bool) {
	if e == nil || len(e.owners) == 0 {
		return elemValue{}, false
	}
	return e.owners[0].value, true
}

func (e *elemEntry) clone() *elemEntry {
	if e == nil {
		return &elemEntry{}
	}
	c := *e
	c.owners = slices.Clone(e.owners)
	return &c
}

// plan is one sync's changes: the transactions to run, in order, and the mirror's new contents once
// they all succeed.
type plan struct {
	txs []*tx
	// The mirror's changes: the ports written (nil: the port is gone), new element entries (nil or without
	// owners and not present: gone), and the chains that become stale (and stop being stale).
	svcs  map[proxy.ServicePortName]*proxy.ServicePort
	elems map[elemRef]*elemEntry
	stale map[string]bool // true: flushed now, delete later; false: wanted again
	// trim holds the chains written by insertion, with how many of their rules are new; 0 cancels a
	// pending trim (the chain was flushed).
	trim map[string]int
	// staleSets holds the affinity sets to delete later (true) or no longer (false: wanted again).
	staleSets map[string]bool
	// kernelChains are the chains the kernel holds, in a rebuild.
	kernelChains map[string]bool
	// r, base and in are what the base objects and the per-Service chains were written from.
	r    *renderer
	base *baseObjects
	in   inputs
	// rewritten counts the per-Service chains written (for the log and the metrics).
	rewritten int
}

func newPlan() *plan {
	return &plan{svcs: map[proxy.ServicePortName]*proxy.ServicePort{}, elems: map[elemRef]*elemEntry{}, stale: map[string]bool{},
		trim: map[string]int{}, staleSets: map[string]bool{}}
}

// commit applies a successful plan to the mirror.
func (m *mirror) commit(p *plan, now time.Time) {
	m.r, m.base, m.in = p.r, p.base, p.in
	for name, sp := range p.svcs {
		if sp == nil {
			delete(m.svcs, name)
		} else {
			m.svcs[name] = sp
		}
	}
	for ref, e := range p.elems {
		if len(e.owners) == 0 && !e.present {
			delete(m.elems, ref)
		} else {
			m.elems[ref] = e
		}
	}
	for c, keep := range p.trim {
		switch tr, ok := m.trims[c]; {
		case keep == 0:
			delete(m.trims, c)
		case ok:
			// Due when the oldest of its old rules is: a chain rewritten again and again still gets them
			// deleted, the newest ones with the others (their insertion was an earlier transaction).
			m.trims[c] = trim{keep: keep, at: tr.at}
		default:
			m.trims[c] = trim{keep: keep, at: now}
		}
	}
	for c, flushed := range p.stale {
		if flushed {
			if _, ok := m.stale[c]; !ok {
				m.stale[c] = now
			}
			delete(m.trims, c)
		} else {
			delete(m.stale, c)
		}
	}
	for s, stale := range p.staleSets {
		if !stale {
			delete(m.staleSets, s)
		} else if _, ok := m.staleSets[s]; !ok {
			m.staleSets[s] = now
		}
	}
}

// leavesLeftovers reports whether the plan leaves something to delete later: chains it flushes, old rules
// behind inserted ones, affinity sets those may name.
func (p *plan) leavesLeftovers() bool {
	for _, flushed := range p.stale {
		if flushed {
			return true
		}
	}
	for _, stale := range p.staleSets {
		if stale {
			return true
		}
	}
	return p.inserted()
}

// inserted reports whether the plan writes a chain by insertion.
func (p *plan) inserted() bool {
	for _, keep := range p.trim {
		if keep > 0 {
			return true
		}
	}
	return false
}

// entry returns the plan's copy of an element entry, made from the mirror's on first use.
func (p *plan) entry(m *mirror, ref elemRef) *elemEntry {
	if e, ok := p.elems[ref]; ok {
		return e
	}
	e := m.elems[ref].clone()
	p.elems[ref] = e
	return e
}

// claim records that a port wants an element (with a value) or no longer wants it (drop).
func (p *plan) claim(m *mirror, name proxy.ServicePortName, el *setElem, drop bool) {
	e := p.entry(m, elemRef{set: el.set, key: el.key})
	i, found := slices.BinarySearchFunc(e.owners, name, func(o elemOwner, n proxy.ServicePortName) int { return o.name.Compare(n) })
	switch {
	case drop && found:
		e.owners = slices.Delete(e.owners, i, i+1)
	case !drop && found:
		e.owners[i].value = el.value
	case !drop:
		e.owners = slices.Insert(e.owners, i, elemOwner{name: name, value: el.value})
	}
}

// elementOps adds to t the element changes that bring the kernel from what it holds to what the plan's
// entries want: deletions first, then additions (a changed value is a deletion and an addition).
func (p *plan) elementOps(t *tx) {
	refs := slices.SortedFunc(maps.Keys(p.elems), compareRef)
	var dels, adds []elemRef
	for _, ref := range refs {
		e := p.elems[ref]
		v, want := e.want()
		switch {
		case e.present && (!want || v != e.written):
			dels = append(dels, ref)
			if want {
				adds = append(adds, ref)
			}
		case !e.present && want:
			adds = append(adds, ref)
		}
	}
	emit := func(kind opKind, refs []elemRef) {
		var cur *op
		for _, ref := range refs {
			if cur == nil || cur.target != ref.set {
				t.add(op{kind: kind, target: ref.set})
				cur = &t.ops[len(t.ops)-1]
			}
			el := element{key: ref.key}
			if kind == opAdd {
				el.value, _ = p.elems[ref].want()
			} else {
				el.value = p.elems[ref].written
			}
			cur.elems = append(cur.elems, el)
		}
	}
	emit(opDelete, dels)
	emit(opAdd, adds)
	for _, ref := range refs {
		e := p.elems[ref]
		e.written, e.present = e.want()
	}
}

func compareRef(a, b elemRef) int {
	if a.set != b.set {
		if a.set < b.set {
			return -1
		}
		return 1
	}
	return compareKey(a.key, b.key)
}

func compareKey(a, b elemKey) int {
	if c := a.addr.Compare(b.addr); c != 0 {
		return c
	}
	if c := a.addr2.Compare(b.addr2); c != 0 {
		return c
	}
	if a.proto != b.proto {
		return int(a.proto) - int(b.proto)
	}
	return int(a.port) - int(b.port)
}
