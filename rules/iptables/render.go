package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

// largeClusterEndpoints is upstream's threshold: above this many endpoints in total, the endpoint rules
// carry no comments (they can make up 40% of the payload).
const largeClusterEndpoints = 1000

// Result is one rendered payload.
type Result struct {
	// Payload is the iptables-restore input for the filter and nat tables, each ending with COMMIT, meant
	// for `iptables-restore --noflush`. It is valid until the next Render call.
	Payload []byte
	// Rules counts the rules written per table ("filter", "nat"), as upstream's
	// sync_proxy_rules_iptables_last metric does.
	Rules map[string]int
	// RulesTotal counts the rules we own per table once the payload is applied, unchanged chains
	// included, as upstream's sync_proxy_rules_iptables_total metric does.
	RulesTotal map[string]int
	// Chains lists, per table and sorted, the chains we own once the payload is applied (kubelet's
	// KUBE-FIREWALL only when we write it). Valid until the next Render call.
	Chains map[string][]string
	// Deleted lists, per table, the chains the payload deletes. Valid until the next Render call.
	Deleted map[string][]string
	// Full reports whether every per-Service chain was rewritten (a partial render becomes full-like when
	// the node facts the rules depend on changed since prev).
	Full bool
	// Chunks, when set, splits Payload into transactions to restore one after the other, in order (see
	// Config.ChunkLines); Payload as a whole is still a valid input.
	Chunks [][]byte
}

// Renderer turns snapshots into iptables-restore payloads. It keeps caches and buffers between calls and
// is not safe for concurrent use.
type Renderer struct {
	cfg  Config
	mark string // the masquerade mark as upstream formats it, "0x00004000" for bit 14

	// The fields from here to renderScratch are state that must survive between renders.

	// states caches per Service port what does not change unless the port does; order holds the states of
	// last's ports sorted by name, owned the nat chains they and the shared chains make up, sorted, and
	// total their endpoints. They are valid when last is not nil.
	states map[proxy.ServicePortName]*svcState
	order  []*svcState
	owned  []string
	total  int
	last   *proxy.Snapshot

	// shared holds the shared chains and what was last written into each; dispatch says whether nat
	// KUBE-SERVICES dispatches to buckets (with hysteresis, so it depends on the renders before) and
	// bucketsLast which buckets the last render had.
	shared      sharedChains
	dispatch    bool
	bucketsLast map[int]bool

	probs []string // probability's 1/n, formatted, by n

	// Per-render scratch buffers, kept only for their storage.
	renderScratch
}

// renderScratch is a render's working storage. Each render resets or overwrites what it uses before use,
// so nothing here carries meaning from one render to the next, only capacity. The Result's payload and
// most of its slices point into it, which is why they are valid until the next render.
type renderScratch struct {
	scratch xtables.Lines // the shared-chain fragments of the port being refreshed (see renderShared)
	// removed and added are the own chains of the ports removed or replaced, and of those added or
	// replaced, since last; ownedSpare is the storage the owned list had before its last update.
	removed, added, ownedSpare []string
	// dirty holds the ports whose state must be refreshed (see sync), write those whose chains a partial
	// render writes, touched the buckets of the cluster IPs of the ports changed since prev.
	dirty, write map[proxy.ServicePortName]bool
	touched      map[int]bool
	// bucketsNow lists this render's bucket chains, sorted, and bucketRules counts their rules.
	bucketsNow  []string
	bucketRules int
	// natOut and filterOut are the shared chains buildNAT and buildFilter return; natDecl the nat chains
	// the payload declares, stale those it deletes; ownScratch collects chain names for a moment.
	natOut, filterOut          []*chainOut
	natDecl, stale, ownScratch []string
	own                        xtables.Lines // the own chains of the ports written, each port's rules a span
	spans                      []span        // where each port's rules lie in own
	chainsOut                  []string      // Result.Chains["nat"] when there are buckets
	out                        []byte        // the payload
}

// NewRenderer returns a renderer for one configuration and IP family.
func NewRenderer(cfg Config) *Renderer {
	if cfg.Family == "" {
		cfg.Family = v1.IPv4Protocol
	}
	return &Renderer{
		cfg:         cfg,
		mark:        fmt.Sprintf("%#08x", cfg.MasqueradeMark()),
		states:      map[proxy.ServicePortName]*svcState{},
		shared:      newSharedChains(),
		bucketsLast: map[int]bool{},
		renderScratch: renderScratch{
			dirty:   map[proxy.ServicePortName]bool{},
			write:   map[proxy.ServicePortName]bool{},
			touched: map[int]bool{},
		},
	}
}

// Shrink drops the payload buffers a big render grew, which the small partial renders that follow do not
// need (a full render at 10k Services fills two of ~11 MB). Call it once the payload has been written.
func (r *Renderer) Shrink() {
	if cap(r.out) > 1<<20 {
		r.out = nil
	}
	if cap(r.own.B) > 1<<20 {
		r.own.B = nil
	}
}

// Large reports whether the last render was of a large ruleset: more than 1000 endpoints (upstream's
// large-cluster mode) or a dispatching KUBE-SERVICES.
func (r *Renderer) Large() bool { return r.total > largeClusterEndpoints || r.dispatch }

// probability returns 1/n formatted as upstream does ("%0.10f").
func (r *Renderer) probability(n int) string {
	for len(r.probs) <= n {
		i := len(r.probs)
		if i == 0 {
			r.probs = append(r.probs, "")
			continue
		}
		r.probs = append(r.probs, strconv.FormatFloat(1/float64(i), 'f', 10, 64))
	}
	return r.probs[n]
}

// globals returns what besides the ports shapes the per-Service chains; total is the snapshot's number of
// endpoints.
func (r *Renderer) globals(snap *proxy.Snapshot, total int) globals {
	var g globals
	g.large = total > largeClusterEndpoints
	g.nodeIP = r.cfg.NodeIP(&snap.Node)
	g.ifLocal, g.ifNotLocal = xtables.LocalArgs(r.cfg.LocalDetector.For(r.cfg.Family, &snap.Node))
	return g
}

var sharedNATChains = []string{chainMarkMasq, chainNodePorts, chainPostrouting, chainServices}

// sync brings order, owned and total in line with snap, marking in r.dirty the ports whose state must be
// refreshed. A rebuild walks all of snap; otherwise only what changed since last.
func (r *Renderer) sync(snap *proxy.Snapshot, rebuild bool, changedSinceLast []proxy.ServicePortName) {
	clear(r.dirty)
	if rebuild {
		r.order = r.order[:0]
		r.total = 0
		for name, sp := range snap.Services {
			st := r.states[name]
			if st == nil {
				st = newSvcState(name)
				r.states[name] = st
			}
			r.order = append(r.order, st)
			r.total += len(sp.Endpoints)
		}
		slices.SortFunc(r.order, func(a, b *svcState) int { return a.key.Compare(b.key) })
		if len(r.states) > len(snap.Services) {
			for name := range r.states {
				if _, ok := snap.Services[name]; !ok {
					delete(r.states, name)
				}
			}
		}
		return
	}
	for _, name := range changedSinceLast {
		sp := snap.Services[name]
		i, found := slices.BinarySearchFunc(r.order, name, func(st *svcState, n proxy.ServicePortName) int { return st.key.Compare(n) })
		switch {
		case sp != nil && !found:
			st := r.states[name]
			if st == nil {
				st = newSvcState(name)
				r.states[name] = st
			}
			r.order = slices.Insert(r.order, i, st)
		case sp == nil && found:
			st := r.order[i]
			r.order = slices.Delete(r.order, i, i+1)
			r.removed = append(r.removed, st.chains...)
			if st.sp != nil {
				r.total -= len(st.sp.Endpoints)
			}
			delete(r.states, name)
			continue
		case sp == nil:
			continue
		}
		st := r.order[i]
		if st.sp != nil {
			r.total -= len(st.sp.Endpoints)
		}
		r.total += len(sp.Endpoints)
		r.dirty[name] = true
	}
}

// Render produces one iptables-restore input with the filter and the nat table.
//
// With full set, every chain we own is declared and rewritten, and the per-Service chains in existing (the
// KUBE-* chains found in the kernel, per table, as the writer lists them on full syncs) that are no longer
// wanted are flushed and deleted. Otherwise prev must be the last snapshot successfully applied: the shared
// chains are rewritten as upstream does on a partial sync, only the per-Service chains of
// snap.Changes(prev) are declared and rewritten, and those of removed or changed Services that are no
// longer wanted are deleted. If the node facts the rules depend on (primary IP, pod CIDRs) differ between
// prev and snap, every per-Service chain is rewritten.
//
// The returned Result, its payload and its slices are valid until the next call.
func (r *Renderer) Render(snap, prev *proxy.Snapshot, full bool, existing map[string][]string) (*Result, error) {
	if snap == nil {
		return nil, fmt.Errorf("rendering iptables rules: no snapshot")
	}
	if snap.Family != "" && snap.Family != r.cfg.Family {
		return nil, fmt.Errorf("rendering iptables rules: snapshot is %s, renderer is %s", snap.Family, r.cfg.Family)
	}
	if !full && prev == nil {
		full = true
	}
	res, err := r.render(snap, prev, full, existing)
	if err != nil {
		// The caches may be half updated: start over next time.
		r.last = nil
		r.shared.reset()
		return nil, fmt.Errorf("rendering iptables rules: %w", err)
	}
	return res, nil
}

// job is what a render decides before its passes, and they share.
type job struct {
	snap, prev *proxy.Snapshot
	full       bool                    // every chain is declared and rewritten
	rebuild    bool                    // the caches are rebuilt from snap: full, first or after a failure
	rewriteAll bool                    // every per-Service chain is written: full, or the node facts changed
	changes    []proxy.ServicePortName // since prev, for a partial render
	g          globals
}

// writes reports whether the job writes the own chains of st's port.
func (r *Renderer) writes(j *job, st *svcState) bool { return j.rewriteAll || r.write[st.key] }

func (r *Renderer) render(snap, prev *proxy.Snapshot, full bool, existing map[string][]string) (*Result, error) {
	j := r.begin(snap, prev, full)

	// Pass 1: refresh the state of changed ports, collect the chains to declare.
	endpointsWritten, err := r.refreshStates(&j)
	if err != nil {
		return nil, err
	}
	r.updateOwned(j.rebuild)

	// Pass 2: the shared chains, of which a partial render writes only those that changed.
	r.stale = r.stale[:0]
	natShared := r.buildNAT(snap, full, r.touched)
	filterChains := r.buildFilter(snap, full)
	r.collectStale(&j, existing)
	r.declareNAT(natShared)

	// Pass 3: the payload.
	r.out = slices.Grow(r.out[:0], r.payloadEstimate(natShared, filterChains, endpointsWritten))
	res := &Result{
		Rules:      map[string]int{},
		RulesTotal: map[string]int{},
		Chains:     map[string][]string{},
		Deleted:    map[string][]string{"filter": nil, "nat": r.stale},
		Full:       j.rewriteAll,
	}
	r.writeFilter(res, filterChains)
	ownRules := r.renderOwnChains(&j)
	r.writeNAT(res, natShared, ownRules)
	res.Payload = r.out
	return res, nil
}

// begin brings the caches in line with snap and decides what the render writes.
func (r *Renderer) begin(snap, prev *proxy.Snapshot, full bool) job {
	j := job{snap: snap, prev: prev, full: full, rebuild: full || r.last == nil}
	if !full {
		j.changes = snap.Changes(prev)
	}
	r.removed, r.added = r.removed[:0], r.added[:0]
	switch {
	case j.rebuild:
		r.sync(snap, true, nil)
	case r.last == prev:
		r.sync(snap, false, j.changes)
	default:
		r.sync(snap, false, snap.Changes(r.last))
	}
	r.last = snap
	switch n := len(r.order); {
	case !r.dispatch && n >= dispatchOn:
		r.dispatch = true
	case r.dispatch && n < dispatchOff:
		r.dispatch = false
	}
	clear(r.touched)
	for _, name := range j.changes {
		for _, sn := range []*proxy.Snapshot{prev, snap} {
			if sp := sn.Services[name]; sp != nil {
				r.touched[bucketOf(sp.ClusterIP)] = true
			}
		}
	}

	j.g = r.globals(snap, r.total)
	j.rewriteAll = full
	if !full {
		pg := r.globals(prev, 0)
		j.rewriteAll = !pg.sameSemantics(&j.g)
	}
	clear(r.write)
	if !j.rewriteAll {
		for _, name := range j.changes {
			r.write[name] = true
		}
	}
	return j
}

// refreshStates refreshes the state of the ports that changed (all of them on a rebuild), collects in
// r.natDecl the own chains of the ports to write and returns how many endpoints those have.
func (r *Renderer) refreshStates(j *job) (int, error) {
	r.natDecl = r.natDecl[:0]
	endpointsWritten := 0
	for _, st := range r.order {
		write := r.writes(j, st)
		if j.rebuild || r.dirty[st.key] || write {
			if err := r.refresh(st, j.snap.Services[st.key], j.rebuild); err != nil {
				return 0, err
			}
		}
		if write {
			r.natDecl = append(r.natDecl, st.chains...)
			endpointsWritten += len(st.sp.Endpoints)
		}
	}
	return endpointsWritten, nil
}

// refresh brings st in line with sp, its port in the snapshot being rendered. Unless the caches are being
// rebuilt, it records the chains it replaces in r.removed and r.added.
func (r *Renderer) refresh(st *svcState, sp *proxy.ServicePort, rebuild bool) error {
	if st.sp == sp {
		return nil
	}
	p, err := makePlan(st, sp)
	if err != nil {
		return err
	}
	if !rebuild {
		r.removed = append(r.removed, st.chains...)
	}
	st.pruneSeps(sp)
	st.plan = p
	r.renderShared(st, sp, &st.plan)
	st.chains = ownChains(st, sp, &st.plan, st.chains)
	st.sp = sp
	st.ownRules = 0
	if !rebuild {
		r.added = append(r.added, st.chains...)
	}
	return nil
}

// updateOwned brings r.owned in line with r.order: built anew on a rebuild, else merged with the chains
// removed and added since last.
func (r *Renderer) updateOwned(rebuild bool) {
	if !rebuild {
		r.owned, r.ownedSpare = mergeSorted(r.ownedSpare, r.owned, r.removed, r.added), r.owned
		return
	}
	r.owned = append(r.owned[:0], sharedNATChains...)
	for _, st := range r.order {
		r.owned = append(r.owned, st.chains...)
	}
	slices.Sort(r.owned)
}

// collectStale adds to r.stale, which holds the bucket chains that emptied, the per-Service chains the
// payload deletes, and sorts it.
func (r *Renderer) collectStale(j *job, existing map[string][]string) {
	if j.full {
		r.staleExisting(existing["nat"])
	} else {
		r.staleReplaced(j.prev, j.changes)
	}
	slices.Sort(r.stale)
	r.stale = slices.Compact(r.stale)
}

// staleExisting adds to r.stale the per-Service chains of existing, found in the kernel, that are no
// longer wanted.
func (r *Renderer) staleExisting(existing []string) {
	for _, c := range existing {
		if !isServiceChain(c) {
			continue
		}
		if _, found := slices.BinarySearch(r.owned, c); found {
			continue
		}
		if _, found := slices.BinarySearch(r.bucketsNow, c); found {
			continue
		}
		r.stale = append(r.stale, c)
	}
}

// staleReplaced adds to r.stale the chains prev had for the ports changed since, that are no longer wanted.
func (r *Renderer) staleReplaced(prev *proxy.Snapshot, changes []proxy.ServicePortName) {
	for _, name := range changes {
		old := prev.Services[name]
		if old == nil {
			continue
		}
		st := r.states[name]
		if st == nil {
			st = newSvcState(name) // removed from snap: a throwaway state names the old chains
		}
		op, err := makePlan(st, old)
		if err != nil {
			continue // prev was rendered before, so this does not happen; nothing to delete if it does
		}
		r.ownScratch = ownChains(st, old, &op, r.ownScratch)
		for _, c := range r.ownScratch {
			if _, found := slices.BinarySearch(r.owned, c); !found {
				r.stale = append(r.stale, c)
			}
		}
	}
}

// declareNAT completes r.natDecl, which holds the own chains of the ports to write, with the shared
// chains written and the stale chains, sorted.
func (r *Renderer) declareNAT(natShared []*chainOut) {
	r.natDecl = declared(r.natDecl, natShared)
	r.natDecl = append(r.natDecl, r.stale...)
	slices.Sort(r.natDecl)
	r.natDecl = slices.Compact(r.natDecl)
}

// payloadEstimate is about the size of the payload, so that r.out grows once.
func (r *Renderer) payloadEstimate(natShared, filterChains []*chainOut, endpointsWritten int) int {
	estimate := 40*len(r.natDecl) + 400*endpointsWritten + 1024
	for _, c := range natShared {
		if c.write {
			estimate += len(c.w.B)
		}
	}
	for _, c := range filterChains {
		estimate += len(c.w.B)
	}
	return estimate
}

// writeFilter appends the filter table to r.out, if any of its chains is written, and records it in res.
func (r *Renderer) writeFilter(res *Result, filterChains []*chainOut) {
	var filterNames []string
	filterWritten, filterTotal := 0, 0
	for _, c := range filterChains {
		filterNames = append(filterNames, c.name)
		filterTotal += c.w.Lines
		if c.write {
			filterWritten += c.w.Lines
		}
	}
	slices.Sort(filterNames)
	if decl := declared(nil, filterChains); len(decl) > 0 {
		r.out = append(r.out, "*filter\n"...)
		for _, c := range decl {
			r.out = xtables.AppendChainLine(r.out, c)
		}
		for _, c := range filterChains {
			if c.write {
				r.out = append(r.out, c.w.B...)
			}
		}
		r.out = append(r.out, "COMMIT\n"...)
	}
	res.Rules["filter"], res.RulesTotal["filter"] = filterWritten, filterTotal
	res.Chains["filter"] = filterNames
}

// renderOwnChains renders into r.own the own chains of the ports to write, each port's rules a span of
// r.own.b, and returns how many rules the own chains of all ports have.
func (r *Renderer) renderOwnChains(j *job) (ownRules int) {
	w := &r.own
	w.Reset()
	r.spans = r.spans[:0]
	for _, st := range r.order {
		if r.writes(j, st) {
			start := len(w.B)
			st.ownRules = r.renderOwn(w, st, st.sp, &st.plan, &j.g)
			r.spans = append(r.spans, span{st: st, start: start, end: len(w.B)})
		}
		ownRules += st.ownRules
	}
	return ownRules
}

// writeNAT appends the nat table to r.out, in one transaction or in chunks, and records it in res.
func (r *Renderer) writeNAT(res *Result, natShared []*chainOut, ownRules int) {
	sharedTotal, sharedWritten := r.bucketRules, 0
	for _, c := range natShared {
		if !isBucketChain(c.name) {
			sharedTotal += c.w.Lines
		}
		if c.write {
			sharedWritten += c.w.Lines
		}
	}
	if r.cfg.ChunkLines > 0 && r.own.Lines > 2*r.cfg.ChunkLines {
		r.chunked(res, natShared)
	} else {
		r.single(natShared)
	}
	res.Rules["nat"] = sharedWritten + r.own.Lines
	res.RulesTotal["nat"] = sharedTotal + ownRules
	res.Chains["nat"] = r.owned
	if len(r.bucketsNow) > 0 {
		r.chainsOut = mergeSorted(r.chainsOut, r.owned, nil, r.bucketsNow)
		res.Chains["nat"] = r.chainsOut
	}
}

// span is the rules of one port's own chains in the render's own-chain buffer.
type span struct {
	st         *svcState
	start, end int
}

// single appends the nat table to r.out as one transaction.
func (r *Renderer) single(natShared []*chainOut) {
	if len(r.natDecl) == 0 && r.own.Lines == 0 {
		return // nothing changed in nat
	}
	r.out = append(r.out, "*nat\n"...)
	for _, c := range r.natDecl {
		r.out = xtables.AppendChainLine(r.out, c)
	}
	for _, c := range natShared {
		if c.write {
			r.out = append(r.out, c.w.B...)
		}
	}
	r.out = append(r.out, r.own.B...)
	r.out = appendDeletes(r.out, r.stale)
	r.out = append(r.out, "COMMIT\n"...)
}

// chunked rewrites r.out, which holds the filter table so far, as several transactions: iptables-nft
// restores one big --noflush transaction in time that grows faster than its size (10k Services: ~55 s in
// one, under 3 s in chunks of ~2,500 rules here). KUBE-MARK-MASQ and KUBE-POSTROUTING first, together
// (the ports' chains jump to the one, and the mark it sets must be the one the other masquerades), then the
// ports' own chains, a few hundred ports at a time (a port's chains only refer to each other,
// and nothing refers to them until the shared chains are written), then the filter table and the shared
// nat chains that jump to the ports, and the deletion of stale chains. Each transaction is atomic; a failure
// part way leaves working rules (ports rewritten or not, the old dispatch) and makes the next sync full.
func (r *Renderer) chunked(res *Result, natShared []*chainOut) {
	filter := slices.Clone(r.out)
	r.out = r.out[:0]
	res.Chunks = res.Chunks[:0]
	var bounds []int
	cut := func() { bounds = append(bounds, len(r.out)) }
	first := func(c *chainOut) bool { return c.write && (c.name == chainMarkMasq || c.name == chainPostrouting) }
	if r.sharedTransaction(natShared, first, nil) {
		cut()
	}
	for i := 0; i < len(r.spans); {
		j, lines := i, 0
		for j < len(r.spans) && (j == i || lines < r.cfg.ChunkLines) {
			lines += r.spans[j].st.ownRules
			j++
		}
		r.ownScratch = r.ownScratch[:0]
		for _, sp := range r.spans[i:j] {
			r.ownScratch = append(r.ownScratch, sp.st.chains...)
		}
		slices.Sort(r.ownScratch)
		r.out = append(r.out, "*nat\n"...)
		for _, c := range r.ownScratch {
			r.out = xtables.AppendChainLine(r.out, c)
		}
		r.out = append(r.out, r.own.B[r.spans[i].start:r.spans[j-1].end]...)
		r.out = append(r.out, "COMMIT\n"...)
		cut()
		i = j
	}
	r.out = append(r.out, filter...)
	r.sharedTransaction(natShared, func(c *chainOut) bool { return c.write && !first(c) }, r.stale)
	cut()
	start := 0
	for _, b := range bounds {
		if b > start {
			res.Chunks = append(res.Chunks, r.out[start:b])
		}
		start = b
	}
}

// sharedTransaction appends to r.out a nat transaction that rewrites the shared chains pick selects and
// deletes the chains in deletes; it appends nothing, and returns false, when there is neither.
func (r *Renderer) sharedTransaction(natShared []*chainOut, pick func(*chainOut) bool, deletes []string) bool {
	r.ownScratch = r.ownScratch[:0]
	for _, c := range natShared {
		if pick(c) {
			r.ownScratch = append(r.ownScratch, c.name)
		}
	}
	r.ownScratch = append(r.ownScratch, deletes...)
	if len(r.ownScratch) == 0 {
		return false
	}
	slices.Sort(r.ownScratch)
	r.out = append(r.out, "*nat\n"...)
	for _, c := range r.ownScratch {
		r.out = xtables.AppendChainLine(r.out, c)
	}
	for _, c := range natShared {
		if pick(c) {
			r.out = append(r.out, c.w.B...)
		}
	}
	r.out = appendDeletes(r.out, deletes)
	r.out = append(r.out, "COMMIT\n"...)
	return true
}

func appendDeletes(b []byte, chains []string) []byte {
	for _, c := range chains {
		b = append(b, "-X "...)
		b = append(b, c...)
		b = append(b, '\n')
	}
	return b
}

// mergeSorted writes into dst's storage the sorted list a minus remove plus add and returns it. a must be
// sorted and must not share storage with dst; remove and add are sorted here.
func mergeSorted(dst, a, remove, add []string) []string {
	slices.Sort(remove)
	slices.Sort(add)
	out := dst[:0]
	i, j, k := 0, 0, 0
	for i < len(a) || j < len(add) {
		if j == len(add) || (i < len(a) && a[i] <= add[j]) {
			for k < len(remove) && remove[k] < a[i] {
				k++
			}
			if k < len(remove) && remove[k] == a[i] {
				k++
			} else {
				out = append(out, a[i])
			}
			i++
		} else {
			out = append(out, add[j])
			j++
		}
	}
	return out
}

const nodePortsComment = "kubernetes service nodeports; NOTE: this must be the last rule in this chain"

// writeNodePortJumps writes the last rules of KUBE-SERVICES, sending traffic to the NodePort addresses on
// to KUBE-NODEPORTS.
func (r *Renderer) writeNodePortJumps(w *xtables.Lines, snap *proxy.Snapshot) {
	ipv6 := r.cfg.Family == v1.IPv6Protocol
	localhost := r.cfg.LocalhostNodePortsActive(&snap.Node)
	npa := r.cfg.nodePortAddrs(&snap.Node)
	if npa.all {
		w.Rule(chainServices).Comment(nodePortsComment).T("-m", "addrtype", "--dst-type", "LOCAL")
		// Localhost NodePorts never work on IPv6, and on IPv4 only with route_localnet.
		if ipv6 {
			w.T("!", "-d", "::1/128")
		} else if !localhost {
			w.T("!", "-d", "127.0.0.0/8")
		}
		w.T("-j", chainNodePorts).End()
		return
	}

	loopback := netip.MustParsePrefix("127.0.0.0/8")
	if ipv6 {
		loopback = netip.MustParsePrefix("::1/128")
	}
	loopbackOK := !ipv6 && localhost
	if npa.primary.IsValid() {
		w.Rule(chainServices).Comment(nodePortsComment).T("-d").Addr(npa.primary).T("-j", chainNodePorts).End()
	}
	excluded := false
	for _, p := range npa.prefixes {
		inLoopback := p.Bits() >= loopback.Bits() && loopback.Contains(p.Addr())
		if inLoopback && !loopbackOK {
			continue // as upstream, which logs that localhost NodePorts are not possible here
		}
		if !loopbackOK && !excluded && p.Contains(loopback.Addr()) {
			// The prefix includes loopback, which must not reach KUBE-NODEPORTS. Upstream lists addresses
			// one by one and skips the loopback ones; here they leave KUBE-SERVICES first.
			w.Rule(chainServices).Comment("kubernetes service nodeports: no localhost NodePorts").
				T("-d").Prefix(loopback).T("-j", "RETURN").End()
			excluded = true
		}
		w.Rule(chainServices).Comment(nodePortsComment).T("-d").Prefix(p).
			T("-m", "addrtype", "--dst-type", "LOCAL", "-j", chainNodePorts).End()
	}
}
