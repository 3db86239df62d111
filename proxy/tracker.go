package proxy

import (
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
	services map[serviceKey]*v1.Service
	slices   map[serviceKey]map[string]*parsedSlice
	node     *v1.Node
	// pending holds the Services to rebuild at the next snapshot; rebuildAll is set when something every
	// Service depends on (the node's zone) changed.
	pending    map[serviceKey]struct{}
	rebuildAll bool
	// svcPending holds, per Service with a pending Service change, its state at the last snapshot (nil
	// if it did not exist), so that changes which cancel out stop being pending. epPending holds the
	// Services with pending endpoint changes. Both feed the metrics.
	svcPending map[serviceKey]*v1.Service
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
		services:   map[serviceKey]*v1.Service{},
		slices:     map[serviceKey]map[string]*parsedSlice{},
		pending:    map[serviceKey]struct{}{},
		svcPending: map[serviceKey]*v1.Service{},
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
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	key := serviceKey{Namespace: obj.Namespace, Name: obj.Name}
	t.mu.Lock()
	old := t.services[key]
	if cur == nil {
		delete(t.services, key)
	} else {
		t.services[key] = cur
	}
	t.stats.ServiceChanges++ // like upstream, every event counts
	changed := !sameServiceInput(old, cur)
	if changed {
		base, wasPending := t.svcPending[key]
		if !wasPending {
			base = old
		}
		if sameServiceInput(base, cur) {
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

// sameServiceInput reports whether two versions of a Service would be proxied identically.
func sameServiceInput(a, b *v1.Service) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Labels[LabelServiceProxyName] == b.Labels[LabelServiceProxyName] &&
		hasLabel(a, LabelServiceProxyName) == hasLabel(b, LabelServiceProxyName) &&
		equality.Semantic.DeepEqual(a.Spec, b.Spec) &&
		equality.Semantic.DeepEqual(a.Status.LoadBalancer, b.Status.LoadBalancer)
}

func hasLabel(s *v1.Service, l string) bool { _, ok := s.Labels[l]; return ok }

// OnEndpointSlice records an added or updated slice (cur) or a deleted one (cur nil, prev the last state).
func (t *Tracker) OnEndpointSlice(prev, cur *discovery.EndpointSlice) {
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	if prev != nil && cur != nil {
		// A slice relabelled to another Service (or to none) first leaves the Service it belonged to.
		if old, err := sliceService(prev); err == nil {
			if now, err := sliceService(cur); err != nil || now != old {
				t.OnEndpointSlice(prev, nil)
			}
		}
	}
	key, err := sliceService(obj)
	if err != nil {
		if cur != nil && (prev == nil || !equality.Semantic.DeepEqual(prev.Labels, cur.Labels)) {
			t.report.skip("EndpointSlice", obj.Namespace+"/"+obj.Name, err.Error())
		}
		return
	}
	var ps *parsedSlice
	var problems []string
	if cur != nil {
		ps, problems = parseSlice(cur, t.nodeName)
	}
	t.mu.Lock()
	t.stats.EndpointChanges++ // like upstream, every event counts
	bySlice := t.slices[key]
	if ps != nil && sameParsedSlice(bySlice[obj.Name], ps) {
		// A resync or a change to fields the proxy does not use: nothing to rebuild, the trigger time was
		// already recorded, and the problems reported, when this content first arrived.
		t.mu.Unlock()
		return
	}
	defer func() {
		for _, p := range problems {
			t.report.skip("EndpointSlice", obj.Namespace+"/"+obj.Name, p)
		}
	}()
	if ps == nil {
		if _, ok := bySlice[obj.Name]; !ok {
			t.mu.Unlock()
			return
		}
		delete(bySlice, obj.Name)
		if len(bySlice) == 0 {
			delete(t.slices, key)
		}
	} else {
		if bySlice == nil {
			bySlice = map[string]*parsedSlice{}
			t.slices[key] = bySlice
		}
		bySlice[obj.Name] = ps
		if ps.triggerTime.After(t.start) {
			t.triggers[ps.family] = append(t.triggers[ps.family], ps.triggerTime)
		}
	}
	t.pending[key] = struct{}{}
	t.epPending[key] = struct{}{}
	t.mu.Unlock()
	t.onChange()
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
	// Informer objects and parsed slices are never modified once stored, so the inputs can be used after
	// the lock is released.
	inputs := make([]serviceInput, 0, len(keys))
	for _, k := range keys {
		in := serviceInput{key: k, svc: t.services[k]}
		for _, ps := range t.slices[k] {
			in.slices = append(in.slices, ps)
		}
		slices.SortFunc(in.slices, func(a, b *parsedSlice) int { return cmpString(a.name, b.name) })
		inputs = append(inputs, in)
	}
	node := t.node
	triggers := t.triggers
	t.pending = map[serviceKey]struct{}{}
	t.svcPending = map[serviceKey]*v1.Service{}
	t.epPending = map[serviceKey]struct{}{}
	t.triggers = map[v1.IPFamily][]time.Time{}
	t.rebuildAll = false
	t.mu.Unlock()

	for _, in := range inputs {
		if in.svc == nil {
			// Slices whose Service is unknown are kept (the Service may simply not have arrived yet) but
			// proxy nothing: say so.
			for _, ps := range in.slices {
				t.report.skip("EndpointSlice", in.key.Namespace+"/"+ps.name, "no Service "+in.key.Name+" to proxy it for")
			}
		}
	}
	out := Build{Triggers: triggers}
	for _, b := range t.builders {
		n := nodeFor(node, t.nodeName, b.family)
		out.Snapshots = append(out.Snapshots, b.build(n, inputs, func(key serviceKey, msg string) {
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
