package nftables

import (
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// chunk bounds the per-Service part of one transaction in a rebuild. The kernel finds a set by walking
// the table's list of sets, so each anonymous set a transaction creates (one per multi-endpoint Service)
// costs time in proportion to the sets already there, and binding it walks the transaction: big
// transactions grow quadratically. Measured on 6.18, 10,000 Services with three endpoints each: 12.9 s
// in one transaction, 8.7 s in chunks of 2,000 Services, 6.8 s in chunks of 200.
type chunk struct {
	anonSets, ops int
}

var defaultChunk = chunk{anonSets: 200, ops: 4000}

// phase collects the per-Service commands of one transaction: the chains to write, the chains to flush
// (rewritten or no longer wanted), the chains whose new rules go ahead of their old ones (see supersede),
// and the affinity sets to delete and to create.
type phase struct {
	flush   []string
	delSets []string
	addSets []setSpec
	chains  []*chainRules
	insert  []*chainRules
	ops     int
	anon    int
}

func newPhase() *phase { return &phase{} }

func (ph *phase) empty() bool {
	return len(ph.flush) == 0 && len(ph.delSets) == 0 && len(ph.addSets) == 0 && len(ph.chains) == 0 && len(ph.insert) == 0
}

// emit appends the phase's commands to t: chains created (adding an existing chain changes nothing),
// chains flushed, affinity sets deleted and created, then the rules: appended to the flushed and new
// chains, inserted (last rule first) at the head of the others.
func (ph *phase) emit(t *tx) {
	for _, c := range slices.Concat(ph.chains, ph.insert) {
		t.add(op{kind: opAdd, chain: &c.spec})
	}
	for _, c := range ph.flush {
		t.add(op{kind: opFlush, chain: &chainSpec{name: c}})
	}
	for _, s := range ph.delSets {
		t.add(op{kind: opDelete, set: &setSpec{name: s, key: layoutAddr}})
	}
	for i := range ph.addSets {
		t.add(op{kind: opAdd, set: &ph.addSets[i]})
	}
	for _, c := range ph.chains {
		for i := range c.rules {
			t.add(op{kind: opAdd, target: c.spec.name, rule: &c.rules[i]})
		}
	}
	for _, c := range ph.insert {
		for i := len(c.rules) - 1; i >= 0; i-- {
			t.add(op{kind: opInsert, target: c.spec.name, rule: &c.rules[i]})
		}
	}
}

// supersede reports whether chain c is written by inserting its new rules ahead of the old ones, which
// stay (unreachable: the new rules end in a verdict) until a later transaction deletes them, instead of
// flushing the chain and filling it in one transaction.
//
// Why: deleting a rule unbinds its anonymous map (the random pick among endpoints), and the kernel then
// marks the map's elements inactive in the next generation. A packet that entered the chain before the
// transaction's commit still runs the old rule, but looks the map up in the generation of the moment: the
// lookup misses and the rule does nothing. A new connection to the Service then goes out without DNAT and
// is rejected as traffic to an unserved port of a cluster IP (refused), or matches nothing for UDP:
// measured on 6.18 in a namespace, one packet in about 20 replacements of a map rule at 20,000 new
// flows per second, with our writer and with `nft -f` alike (a rule without a map: none). A rule still
// in the chain keeps its map's elements active; deleted a transaction later, when no packet can reach
// it, its map goes unseen.
//
// Old rules whose map this may be: with the mirror (known), those written for the port last time; in a
// rebuild, whatever a cluster or local chain the kernel holds may have (written by us or by upstream).
func (p *plan) supersede(old, c *chainRules, known bool) bool {
	if !c.terminates() {
		return false
	}
	if known {
		return old != nil && old.bindsMap()
	}
	name := c.spec.name
	return p.kernelChains[name] && (strings.HasPrefix(name, prefixService) || strings.HasPrefix(name, prefixLocal))
}

// bindsMap reports whether a rule of the chain binds an anonymous map.
func (c *chainRules) bindsMap() bool {
	for _, r := range c.rules {
		for _, t := range r.terms {
			if t.kind == tDNATMap || t.kind == tNumgenVmap {
				return true
			}
		}
	}
	return false
}

// terminates reports whether every packet reaching the chain ends at its last rule: a DNAT, a DNAT map or
// a numgen verdict map (which covers every number it draws), behind nothing but a match of the protocol
// (every packet sent to the chain has the protocol of its Service port).
func (c *chainRules) terminates() bool {
	if len(c.rules) == 0 {
		return false
	}
	terms := c.rules[len(c.rules)-1].terms
	for i, t := range terms {
		last := i == len(terms)-1
		switch {
		case !last && t.kind == tL4Proto:
		case last && (t.kind == tDNAT || t.kind == tDNATMap || t.kind == tNumgenVmap):
		default:
			return false
		}
	}
	return len(terms) > 0
}

// service plans the change of one Service port from what the mirror holds to objs (nil: the port is
// gone). With known false the kernel may hold anything under the port's names (a rebuild): every chain is
// written and flushed first.
func (p *plan) service(m *mirror, ph *phase, name proxy.ServicePortName, sp *proxy.ServicePort, objs *svcObjects, known bool) {
	var old *svcObjects
	if known {
		old = m.written(name)
	}
	wanted := objs
	if wanted == nil {
		wanted = &svcObjects{}
	}
	setsChanged := p.serviceSets(m, ph, old, wanted.sets, known)
	inserted := p.serviceChains(m, ph, old, wanted.chains, known, setsChanged)
	p.dropUnwanted(ph, old, wanted, inserted)
	p.claimElems(m, name, old, wanted.elems)
	if objs != nil {
		p.svcs[name] = sp
	} else {
		p.svcs[name] = nil
	}
}

// serviceSets plans the port's affinity sets: created when new (every one in a rebuild), recreated when
// changed. It reports whether one changed.
func (p *plan) serviceSets(m *mirror, ph *phase, old *svcObjects, sets []setSpec, known bool) (changed bool) {
	oldSets := map[string]*setSpec{}
	if old != nil {
		for i := range old.sets {
			oldSets[old.sets[i].name] = &old.sets[i]
		}
	}
	for i := range sets {
		s := &sets[i]
		o := oldSets[s.name]
		if _, ok := m.staleSets[s.name]; ok {
			p.staleSets[s.name] = false
		}
		switch {
		case !known:
			ph.addSets = append(ph.addSets, *s)
		case o == nil:
			ph.addSets = append(ph.addSets, *s)
		case !o.equal(s):
			// Recreate it: every kernel accepts that, where not all accept a new timeout on an
			// existing set. The chains that use it are rewritten (serviceChains).
			changed = true
			ph.delSets = append(ph.delSets, s.name)
			ph.addSets = append(ph.addSets, *s)
		}
	}
	return changed
}

// serviceChains plans the writing of the port's chains that differ from what the mirror holds (every one
// in a rebuild, or when an affinity set changed): the new rules inserted ahead of the old ones when the
// chain is superseded, else the chain flushed (unless it is new) and filled. It reports whether rules were
// inserted.
func (p *plan) serviceChains(m *mirror, ph *phase, old *svcObjects, chains []chainRules, known, setsChanged bool) (inserted bool) {
	oldChains := map[string]*chainRules{}
	if old != nil {
		for i := range old.chains {
			oldChains[old.chains[i].spec.name] = &old.chains[i]
		}
	}
	for i := range chains {
		c := &chains[i]
		o := oldChains[c.spec.name]
		if o != nil && !setsChanged && o.equal(c) {
			continue
		}
		_, isStale := m.stale[c.spec.name]
		if isStale {
			p.stale[c.spec.name] = false
		}
		if !setsChanged && p.supersede(o, c, known) {
			ph.insert = append(ph.insert, c)
			p.trim[c.spec.name] = len(c.rules)
			inserted = true
		} else {
			if o != nil || !known || isStale {
				ph.flush = append(ph.flush, c.spec.name)
			}
			ph.chains = append(ph.chains, c)
			if _, ok := m.trims[c.spec.name]; ok {
				p.trim[c.spec.name] = 0 // the flush takes the old rules too
			}
		}
		ph.count(c)
		p.rewritten++
	}
	return inserted
}

// count adds the commands and anonymous sets of writing chain c to the phase's size.
func (ph *phase) count(c *chainRules) {
	ph.ops += 2 + len(c.rules)
	for _, r := range c.rules {
		for _, t := range r.terms {
			ph.anon += t.anonSets()
		}
	}
}

// dropUnwanted plans the removal of the chains and affinity sets the port had and no longer wants. The
// chains are flushed, and deleted as stale by a later transaction; the sets are deleted, or, when rules
// were inserted (the old rules behind them may match against the sets), left stale too.
func (p *plan) dropUnwanted(ph *phase, old, wanted *svcObjects, inserted bool) {
	if old == nil {
		return
	}
	wantedChains := make(map[string]bool, len(wanted.chains))
	for i := range wanted.chains {
		wantedChains[wanted.chains[i].spec.name] = true
	}
	for i := range old.chains {
		if n := old.chains[i].spec.name; !wantedChains[n] {
			ph.flush = append(ph.flush, n)
			p.stale[n] = true
		}
	}
	for i := range old.sets {
		n := old.sets[i].name
		if slices.ContainsFunc(wanted.sets, func(s setSpec) bool { return s.name == n }) {
			continue
		}
		if inserted {
			// The old rules, still in the chain, match against it: deleted with them.
			p.staleSets[n] = true
		} else {
			ph.delSets = append(ph.delSets, n)
		}
	}
}

// claimElems moves the port's claims on elements of the shared sets and maps from those of old to elems.
func (p *plan) claimElems(m *mirror, name proxy.ServicePortName, old *svcObjects, elems []setElem) {
	if old != nil {
		for i := range old.elems {
			p.claim(m, name, &old.elems[i], true)
		}
	}
	for i := range elems {
		p.claim(m, name, &elems[i], false)
	}
}

// baseOps appends to t the commands that write the base objects: counters and sets first (rules refer to
// them), then every base and top-level chain flushed and rewritten, then the nodeport-ips elements, then
// the removal of what the configuration no longer wants. In a rebuild (table set), the base chains are
// first deleted and created again, so that a table whose base chains have other hooks or priorities (left
// by another version, or changed by hand) is taken over; upstream does the same once per process.
func baseOps(t *tx, b *baseObjects, table bool) {
	if table {
		t.add(op{kind: opAdd, table: true})
		for i := range baseChains {
			c := &chainSpec{name: baseChains[i].name}
			t.add(op{kind: opAdd, chain: c})
			t.add(op{kind: opDelete, chain: c})
		}
	}
	for _, c := range b.counters {
		t.add(op{kind: opAdd, counter: c})
	}
	for i := range b.sets {
		t.add(op{kind: opAdd, set: &b.sets[i]})
	}
	for i := range b.chains {
		t.add(op{kind: opAdd, chain: &b.chains[i].spec})
	}
	for i := range b.chains {
		t.add(op{kind: opFlush, chain: &chainSpec{name: b.chains[i].spec.name}})
	}
	for i := range b.chains {
		c := &b.chains[i]
		for j := range c.rules {
			t.add(op{kind: opAdd, target: c.spec.name, rule: &c.rules[j]})
		}
	}
	nodePortIPs := &setSpec{name: setNodePortIPs, key: layoutAddr, comment: "IPs that accept NodePort traffic"}
	if b.nodePortSet {
		t.add(op{kind: opFlush, set: nodePortIPs})
		if len(b.nodePortIPs) > 0 {
			o := op{kind: opAdd, target: setNodePortIPs}
			for _, a := range b.nodePortIPs {
				o.elems = append(o.elems, element{key: elemKey{addr: a}})
			}
			t.add(o)
		}
	} else {
		t.add(op{kind: opAdd, set: nodePortIPs})
		t.add(op{kind: opDelete, set: nodePortIPs})
	}
	if !b.localhostReject {
		m := &setSpec{name: mapLocalhostNodePortReject, key: layoutProtoPort, isMap: true}
		t.add(op{kind: opAdd, set: m})
		t.add(op{kind: opDelete, set: m})
	}
	// The reject chains and counters of protocols not rejected (none without the gate; TCP when the
	// userspace proxy serves it), the chains first: their rules name the counters.
	var unrejected []v1.Protocol
	for _, p := range localhostProtocols {
		if !slices.Contains(b.counters, LocalhostRejectCounter(p)) {
			unrejected = append(unrejected, p)
		}
	}
	for _, p := range unrejected {
		c := &chainSpec{name: localhostRejectChain(p)}
		t.add(op{kind: opAdd, chain: c})
		t.add(op{kind: opDelete, chain: c})
	}
	for _, p := range unrejected {
		t.add(op{kind: opAdd, counter: LocalhostRejectCounter(p)})
		t.add(op{kind: opDelete, counter: LocalhostRejectCounter(p)})
	}
}

// baseEqual reports whether two renders of the base objects are the same.
func baseEqual(a, b *baseObjects) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(a.chains, b.chains, func(x, y chainRules) bool { return x.equal(&y) }) &&
		slices.EqualFunc(a.sets, b.sets, func(x, y setSpec) bool { return x.equal(&y) }) && slices.Equal(a.counters, b.counters) && a.nodePortSet == b.nodePortSet &&
		slices.Equal(a.nodePortIPs, b.nodePortIPs) && a.localhostReject == b.localhostReject
}

// planPartial plans the sync from the mirror to snap: the base objects when they changed, and the Service
// ports in changed (every port with all set, or when the inputs of their chains changed), in one
// transaction. Only what differs from the mirror is written.
func planPartial(m *mirror, r *renderer, snap *proxy.Snapshot, changed []proxy.ServicePortName, in *inputs, all bool) *plan {
	p := newPlan()
	t := newTx(r.fam)
	b := r.base(in)
	if !baseEqual(b, m.base) {
		baseOps(t, b, false)
	}
	p.r, p.base, p.in = r, b, *in
	if all || !in.sameServiceInputs(&m.in) {
		changed = slices.Collect(maps.Keys(m.svcs))
		for name := range snap.Services {
			if m.svcs[name] == nil {
				changed = append(changed, name)
			}
		}
		slices.SortFunc(changed, proxy.ServicePortName.Compare)
	}
	ph := newPhase()
	for _, name := range changed {
		sp := snap.Services[name]
		var objs *svcObjects
		if sp != nil {
			objs = r.service(sp, in)
		}
		p.service(m, ph, name, sp, objs, true)
	}
	ph.emit(t)
	p.elementOps(t)
	if !t.empty() {
		p.txs = append(p.txs, t)
	}
	return p
}

// planRebuild plans a rewrite of the whole table when the kernel's state is unknown: it holds ks (read
// from the kernel, nil when the table does not exist). The base objects go first, in one transaction;
// then every Service port's chains and affinity sets, in transactions of at most ch; then the elements
// of the shared sets and maps (from what the kernel holds to what is wanted) and the removal of the
// per-Service chains and affinity sets nothing wants, in a last one. Each transaction leaves a working
// table: a chain is flushed and filled in the same one, and only the last points elements at new chains.
func planRebuild(r *renderer, snap *proxy.Snapshot, in *inputs, ks *kernelState, ch chunk) (*plan, *mirror) {
	m := newMirror()
	p := newPlan()
	if ks != nil {
		p.kernelChains = ks.chains
	}
	b := r.base(in)
	t := newTx(r.fam)
	baseOps(t, b, true)
	p.txs = append(p.txs, t)
	p.r, p.base, p.in = r, b, *in

	// What the kernel holds of the shared sets and maps the base keeps.
	keep := map[string]bool{}
	for _, s := range b.sets {
		keep[s.name] = true
	}
	if ks != nil {
		for ref, v := range ks.elems {
			if keep[ref.set] && ref.set != setNodePortIPs {
				p.elems[ref] = &elemEntry{present: true, written: v}
			}
		}
	}

	names := slices.SortedFunc(maps.Keys(snap.Services), proxy.ServicePortName.Compare)
	ph := newPhase()
	wanted := map[string]bool{}
	wantedSets := map[string]bool{}
	for _, name := range names {
		sp := snap.Services[name]
		objs := r.service(sp, in)
		for _, c := range objs.chains {
			wanted[c.spec.name] = true
		}
		for _, s := range objs.sets {
			wantedSets[s.name] = true
		}
		p.service(m, ph, name, sp, objs, false)
		if ph.anon >= ch.anonSets || ph.ops >= ch.ops {
			t := newTx(r.fam)
			ph.emit(t)
			p.txs = append(p.txs, t)
			ph = newPhase()
		}
	}
	last := newTx(r.fam)
	ph.emit(last)
	p.elementOps(last)
	if ks != nil {
		for _, c := range slices.Sorted(maps.Keys(ks.chains)) {
			if isServiceChain(c) && !wanted[c] {
				last.add(op{kind: opFlush, chain: &chainSpec{name: c}})
				p.stale[c] = true
			}
		}
		for _, s := range slices.Sorted(maps.Keys(ks.sets)) {
			if isAffinitySet(s) && !wantedSets[s] {
				if p.inserted() {
					// Old rules left behind inserted ones may still match against it.
					p.staleSets[s] = true
				} else {
					last.add(op{kind: opDelete, set: &setSpec{name: s, key: layoutAddr}})
				}
			}
		}
	}
	if !last.empty() {
		p.txs = append(p.txs, last)
	}
	return p, m
}
