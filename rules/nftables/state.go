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
}

func newMirror() *mirror {
	return &mirror{svcs: map[proxy.ServicePortName]*proxy.ServicePort{}, elems: map[elemRef]*elemEntry{}, stale: map[string]time.Time{}}
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
	// r, base and in are what the base objects and the per-Service chains were written from.
	r    *renderer
	base *baseObjects
	in   inputs
	// rewritten counts the per-Service chains written (for the log and the metrics).
	rewritten int
}

func newPlan() *plan {
	return &plan{svcs: map[proxy.ServicePortName]*proxy.ServicePort{}, elems: map[elemRef]*elemEntry{}, stale: map[string]bool{}}
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
	for c, flushed := range p.stale {
		if flushed {
			if _, ok := m.stale[c]; !ok {
				m.stale[c] = now
			}
		} else {
			delete(m.stale, c)
		}
	}
}

// flushedStale reports whether the plan flushes chains that are to be deleted later.
func (p *plan) flushedStale() bool {
	for _, flushed := range p.stale {
		if flushed {
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
