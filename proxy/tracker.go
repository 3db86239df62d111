package proxy

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

type serviceKey = types.NamespacedName

// Tracker records Service, EndpointSlice and Node events and turns them into snapshots. Event handlers only
// record what changed (a pending set of Services); the sync goroutine calls Snapshots, which rebuilds just
// those Services. Events that cancel out (added then deleted before a sync, an update that changes nothing a
// dataplane uses) leave the snapshot untouched. It is safe for concurrent use.
type Tracker struct {
	nodeName string
	report   *problemReporter
	// start is when the tracker was created: trigger times before it belong to changes made before this
	// process ran (the initial list), whose latency is not ours to report (upstream's rule).
	start time.Time
	// onChange is called (without the lock) after every event that may change a snapshot.
	onChange func()

	mu       sync.Mutex
	builders []*builder
	// services holds what the proxy reads of each Service (not the API objects, which are dropped).
	services map[serviceKey]*serviceSpec
	// slices holds each Service's parsed slices, sorted by name. A list is never modified once stored
	// (changes store a new one), so snapshot builds use it without the lock.
	slices map[serviceKey][]*parsedSlice
	// owners maps each recorded slice to the Service it is recorded under; unowned holds the slices
	// skipped for want of a Service label (reported once each).
	owners  map[types.NamespacedName]serviceKey
	unowned map[types.NamespacedName]struct{}
	node    *v1.Node
	// serviceCIDRs are the CIDRs of every ServiceCIDR object, sorted.
	serviceCIDRs []netip.Prefix
	// pending holds the Services to rebuild at the next snapshot; rebuildAll is set when something every
	// Service depends on (the node's zone) changed.
	pending    map[serviceKey]struct{}
	rebuildAll bool
	// svcPending holds, per Service with a pending Service change, its state at the last snapshot (nil
	// if it did not exist), so that changes which cancel out stop being pending. epPending holds the
	// Services with pending endpoint changes. Both feed the metrics.
	svcPending map[serviceKey]*serviceSpec
	epPending  map[serviceKey]struct{}
	// triggers holds, per family, the last-change-trigger-times of slices changed since the last snapshot.
	triggers map[v1.IPFamily][]time.Time
	stats    TrackerStats
}

// TrackerStats are cumulative event counts, for the change metrics.
type TrackerStats struct {
	ServiceChanges  uint64
	EndpointChanges uint64
}

// TrackerOptions configure a Tracker.
type TrackerOptions struct {
	// NodeName is the name of this node (for local endpoints and topology).
	NodeName string
	// Families are the IP families to build snapshots for, primary first.
	Families []v1.IPFamily
	// ExternalIPs is the AllowServiceExternalIPs feature gate.
	ExternalIPs bool
	// OnChange is called after each event that may change the snapshots (typically: request a sync).
	OnChange func()
	// Problems receives skipped objects and fields (kind, reason); may be nil.
	Problems ProblemSink
}

// NewTracker returns an empty Tracker.
func NewTracker(o TrackerOptions) *Tracker {
	t := &Tracker{
		nodeName:   o.NodeName,
		report:     newProblemReporter(o.Problems),
		start:      time.Now(),
		onChange:   o.OnChange,
		services:   map[serviceKey]*serviceSpec{},
		slices:     map[serviceKey][]*parsedSlice{},
		owners:     map[types.NamespacedName]serviceKey{},
		unowned:    map[types.NamespacedName]struct{}{},
		pending:    map[serviceKey]struct{}{},
		svcPending: map[serviceKey]*serviceSpec{},
		epPending:  map[serviceKey]struct{}{},
		triggers:   map[v1.IPFamily][]time.Time{},
	}
	if t.onChange == nil {
		t.onChange = func() {}
	}
	for _, f := range o.Families {
		t.builders = append(t.builders, newBuilder(f, serviceOptions{externalIPs: o.ExternalIPs}, o.NodeName))
	}
	return t
}

// OnService records an added or updated Service (cur) or a deleted one (cur nil, prev the last state).
func (t *Tracker) OnService(prev, cur *v1.Service) {
	switch {
	case cur != nil:
		t.setService(serviceKey{Namespace: cur.Namespace, Name: cur.Name}, newServiceSpec(cur))
	case prev != nil:
		t.setService(serviceKey{Namespace: prev.Namespace, Name: prev.Name}, nil)
	}
}

// setService records the Service key's new spec (nil: deleted).
func (t *Tracker) setService(key serviceKey, cur *serviceSpec) {
	t.mu.Lock()
	old := t.services[key]
	if cur == nil {
		delete(t.services, key)
	} else {
		t.services[key] = cur
	}
	t.stats.ServiceChanges++ // like upstream, every event counts
	changed := !old.equal(cur)
	if changed {
		base, wasPending := t.svcPending[key]
		if !wasPending {
			base = old
		}
		if base.equal(cur) {
			// Back to the state of the last snapshot (e.g. added then deleted): nothing is pending any
			// more. Rebuilding it anyway is harmless, so t.pending keeps the key.
			delete(t.svcPending, key)
		} else {
			t.svcPending[key] = base
		}
		t.pending[key] = struct{}{}
	}
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

// OnEndpointSlice records an added or updated slice (cur) or a deleted one (cur nil, prev its last state).
func (t *Tracker) OnEndpointSlice(prev, cur *discovery.EndpointSlice) {
	switch {
	case cur != nil:
		t.setSlice(cur)
	case prev != nil:
		t.deleteSlice(types.NamespacedName{Namespace: prev.Namespace, Name: prev.Name})
	}
}

// ReplaceServices records a full list of the Services (the API server's, after a relist): each is added or
// updated, and the Services not in it are deleted.
func (t *Tracker) ReplaceServices(list []*v1.Service) {
	seen := make(map[serviceKey]struct{}, len(list))
	for _, s := range list {
		if s != nil {
			seen[serviceKey{Namespace: s.Namespace, Name: s.Name}] = struct{}{}
			t.OnService(nil, s)
		}
	}
	t.mu.Lock()
	var gone []serviceKey
	for k := range t.services {
		if _, ok := seen[k]; !ok {
			gone = append(gone, k)
		}
	}
	t.mu.Unlock()
	for _, k := range gone {
		t.setService(k, nil)
	}
}

// ReplaceEndpointSlices records a full list of the EndpointSlices, like ReplaceServices.
func (t *Tracker) ReplaceEndpointSlices(list []*discovery.EndpointSlice) {
	seen := make(map[types.NamespacedName]struct{}, len(list))
	for _, es := range list {
		if es != nil {
			seen[types.NamespacedName{Namespace: es.Namespace, Name: es.Name}] = struct{}{}
			t.setSlice(es)
		}
	}
	t.mu.Lock()
	var gone []types.NamespacedName
	for id := range t.owners {
		if _, ok := seen[id]; !ok {
			gone = append(gone, id)
		}
	}
	for id := range t.unowned {
		if _, ok := seen[id]; !ok {
			delete(t.unowned, id)
		}
	}
	t.mu.Unlock()
	for _, id := range gone {
		t.deleteSlice(id)
	}
}

// setSlice records an added or updated slice. The Tracker keeps only what it parsed from it, and which
// Service it was recorded under, so a slice relabelled to another Service (or to none) leaves the first.
func (t *Tracker) setSlice(es *discovery.EndpointSlice) {
	id := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
	key, keyErr := sliceService(es)
	// The EndpointSlice controller copies a Service's labels onto its slices: one labelled for another
	// proxy belongs to a Service this one does not watch, and is ignored like it (not reported).
	_, otherProxy := es.Labels[LabelServiceProxyName]
	if otherProxy {
		keyErr = errOtherProxy
	}
	var ps *parsedSlice
	var problems []string
	if keyErr == nil {
		ps, problems = parseSlice(es, t.nodeName)
	}
	t.mu.Lock()
	changed := false
	if owner, ok := t.owners[id]; ok && (keyErr != nil || owner != key) {
		t.stats.EndpointChanges++ // leaving counts as a deletion
		t.dropSliceLocked(id, owner)
		changed = true
	}
	if keyErr != nil {
		if _, reported := t.unowned[id]; !reported && !otherProxy {
			problems = []string{keyErr.Error()}
		}
		t.unowned[id] = struct{}{}
	} else {
		delete(t.unowned, id)
		t.stats.EndpointChanges++ // like upstream, every event counts
		stored := t.storeSliceLocked(id, key, ps)
		if !stored && ps != nil {
			problems = nil // reported when this content first arrived
		}
		changed = stored || changed
	}
	t.mu.Unlock()
	for _, p := range problems {
		t.report.skip("EndpointSlice", id.String(), p)
	}
	if changed {
		t.onChange()
	}
}

// storeSliceLocked records ps (nil: no longer usable, as if deleted) as slice id of Service key, and
// reports whether that changed anything. Call it with mu held.
func (t *Tracker) storeSliceLocked(id types.NamespacedName, key serviceKey, ps *parsedSlice) bool {
	bySlice := t.slices[key]
	i, had := findSlice(bySlice, id.Name)
	switch {
	case ps == nil:
		// An address type the proxy does not handle.
		if had {
			t.dropSliceLocked(id, key)
		}
		return had
	case had && sameParsedSlice(bySlice[i], ps):
		// A resync or a change to fields the proxy does not use: nothing to rebuild. (Its trigger time
		// was recorded when this content first arrived.)
		return false
	case had:
		bySlice = slices.Clone(bySlice)
		bySlice[i] = ps
	default:
		bySlice = slices.Insert(slices.Clip(bySlice), i, ps)
	}
	t.slices[key] = bySlice
	t.owners[id] = key
	if ps.triggerTime.After(t.start) {
		t.triggers[ps.family] = append(t.triggers[ps.family], ps.triggerTime)
	}
	t.pending[key] = struct{}{}
	t.epPending[key] = struct{}{}
	return true
}

// deleteSlice records a deleted slice.
func (t *Tracker) deleteSlice(id types.NamespacedName) {
	t.mu.Lock()
	delete(t.unowned, id)
	owner, ok := t.owners[id]
	if ok {
		t.stats.EndpointChanges++
		t.dropSliceLocked(id, owner)
	}
	t.mu.Unlock()
	if ok {
		t.onChange()
	}
}

// dropSliceLocked forgets the slice id recorded under the Service owner and marks that Service pending.
// Call it with mu held.
func (t *Tracker) dropSliceLocked(id types.NamespacedName, owner serviceKey) {
	if i, ok := findSlice(t.slices[owner], id.Name); ok {
		if rest := slices.Delete(slices.Clone(t.slices[owner]), i, i+1); len(rest) > 0 {
			t.slices[owner] = rest
		} else {
			delete(t.slices, owner)
		}
	}
	delete(t.owners, id)
	t.pending[owner] = struct{}{}
	t.epPending[owner] = struct{}{}
}

// findSlice returns where the slice named name is, or would be, in a list sorted by name.
func findSlice(list []*parsedSlice, name string) (int, bool) {
	return slices.BinarySearchFunc(list, name, func(ps *parsedSlice, n string) int { return cmpString(ps.name, n) })
}

// OnNode records this node's object (nil when deleted). A zone change recomputes every Service's endpoints.
func (t *Tracker) OnNode(node *v1.Node) {
	t.mu.Lock()
	oldZone, newZone := nodeZone(t.node), nodeZone(node)
	changed := !equality.Semantic.DeepEqual(nodeFacts(t.node), nodeFacts(node))
	t.node = node
	if oldZone != newZone {
		t.rebuildAll = true
	}
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

func nodeZone(n *v1.Node) string {
	if n == nil {
		return ""
	}
	return n.Labels[v1.LabelTopologyZone]
}

// nodeFacts is the part of a Node that snapshots use.
func nodeFacts(n *v1.Node) any {
	if n == nil {
		return nil
	}
	return []any{n.Status.Addresses, n.Spec.PodCIDRs, nodeZone(n)}
}

// OnServiceCIDRs records the CIDRs of all ServiceCIDR objects (networking.k8s.io/v1); unparsable ones are
// skipped.
func (t *Tracker) OnServiceCIDRs(cidrs []string) {
	var list []netip.Prefix
	for _, c := range cidrs {
		if p, err := parseCIDR(c); err == nil {
			list = append(list, p.Masked())
		}
	}
	slices.SortFunc(list, comparePrefix)
	list = slices.Compact(list)
	t.mu.Lock()
	changed := !slices.Equal(list, t.serviceCIDRs)
	t.serviceCIDRs = list
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Node returns the last Node object seen (nil before the first and after deletion). Do not modify it.
func (t *Tracker) Node() *v1.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node
}

// Pending returns the number of Services with pending Service changes and with pending endpoint changes.
func (t *Tracker) Pending() (services, endpoints int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.svcPending), len(t.epPending)
}

// Stats returns the cumulative event counts.
func (t *Tracker) Stats() TrackerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Families returns the IP families the tracker builds snapshots for, primary first.
func (t *Tracker) Families() []v1.IPFamily {
	out := make([]v1.IPFamily, len(t.builders))
	for i, b := range t.builders {
		out[i] = b.family
	}
	return out
}

// Build is the result of taking the pending changes: one snapshot per family, and the trigger times of the
// slice changes they include (for network programming latency, to be observed once the snapshot is applied).
type Build struct {
	Snapshots []*Snapshot
	Triggers  map[v1.IPFamily][]time.Time
}

// RequeueTriggers puts back trigger times of a build whose snapshots could not be applied, so that they
// are observed once a later sync succeeds.
func (t *Tracker) RequeueTriggers(b Build) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for f, ts := range b.Triggers {
		t.triggers[f] = append(t.triggers[f], ts...)
	}
}

// requeue puts back the changes a failed Snapshots took, under those that arrived since.
func (t *Tracker) requeue(keys []serviceKey, triggers map[v1.IPFamily][]time.Time, svcPending map[serviceKey]*serviceSpec, epPending map[serviceKey]struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		t.pending[k] = struct{}{}
	}
	for k, base := range svcPending {
		if _, newer := t.svcPending[k]; !newer {
			t.svcPending[k] = base
		}
	}
	for k := range epPending {
		t.epPending[k] = struct{}{}
	}
	for f, ts := range triggers {
		t.triggers[f] = append(ts, t.triggers[f]...)
	}
	t.rebuildAll = true
}

// Snapshots takes all pending changes and returns the next snapshot of every family. It must be called from
// one goroutine at a time (the sync loop).
func (t *Tracker) Snapshots() Build {
	t.mu.Lock()
	var keys []serviceKey
	if t.rebuildAll {
		keys = make([]serviceKey, 0, len(t.services)+len(t.pending))
		for k := range t.services {
			keys = append(keys, k)
		}
		for k := range t.pending {
			if _, ok := t.services[k]; !ok {
				keys = append(keys, k)
			}
		}
	} else {
		keys = make([]serviceKey, 0, len(t.pending))
		for k := range t.pending {
			keys = append(keys, k)
		}
	}
	// Service specs and slice lists are never modified once stored, so the inputs can be used after the
	// lock is released.
	inputs := make([]serviceInput, 0, len(keys))
	for _, k := range keys {
		inputs = append(inputs, serviceInput{key: k, svc: t.services[k], slices: t.slices[k]})
	}
	node := t.node
	serviceCIDRs := t.serviceCIDRs
	triggers, svcPending, epPending := t.triggers, t.svcPending, t.epPending
	t.pending = map[serviceKey]struct{}{}
	t.svcPending = map[serviceKey]*serviceSpec{}
	t.epPending = map[serviceKey]struct{}{}
	t.triggers = map[v1.IPFamily][]time.Time{}
	t.rebuildAll = false
	t.mu.Unlock()
	// A panic below (the sync loop recovers it) must not lose the changes taken: they are put back, and
	// the next snapshot is built from every Service, since a builder may have moved on before the panic.
	defer func() {
		if r := recover(); r != nil {
			t.requeue(keys, triggers, svcPending, epPending)
			panic(r)
		}
	}()

	for _, in := range inputs {
		if in.svc == nil {
			// Slices whose Service is unknown are kept but proxy nothing. That is normal (the Service has
			// not arrived yet, was just deleted, or is one this proxy does not watch: headless, another
			// proxy's), so it is noted at -v=2, rate-limited, and not counted as an unusable object.
			for _, ps := range in.slices {
				t.report.note("EndpointSlice", in.key.Namespace+"/"+ps.name, "no Service "+in.key.Name+" to proxy it for")
			}
		}
	}
	out := Build{Triggers: triggers}
	for _, b := range t.builders {
		n := nodeFor(node, t.nodeName, b.family)
		var cidrs []netip.Prefix
		for _, p := range serviceCIDRs {
			if ipFamily(p.Addr()) == b.family {
				cidrs = append(cidrs, p)
			}
		}
		out.Snapshots = append(out.Snapshots, b.build(n, cidrs, inputs, func(key serviceKey, msg string) {
			t.report.skip("Service", key.String(), msg)
		}))
	}
	return out
}

// nodeFor extracts the facts of one family from a Node object.
func nodeFor(n *v1.Node, name string, family v1.IPFamily) Node {
	out := Node{Name: name}
	if n == nil {
		return out
	}
	out.Known = true
	out.Zone = nodeZone(n)
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if ip, err := parseIP(a.Address); err == nil && ipFamily(ip) == family && !slices.Contains(out.IPs, ip) {
				out.IPs = append(out.IPs, ip)
			}
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := parseCIDR(c); err == nil && ipFamily(p.Addr()) == family {
			out.PodCIDRs = append(out.PodCIDRs, p)
		}
	}
	return out
}
