package proxy

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Snapshot is the immutable desired state of one IP family: every proxied Service port with its chosen
// endpoints, and the node facts. Successive snapshots share unchanged *ServicePort values, so a dataplane
// finds what changed by comparing pointers (see Changes). Nothing in a Snapshot may be modified.
type Snapshot struct {
	Family v1.IPFamily
	// Generation increases by one with every snapshot built for this family.
	Generation uint64
	Node       Node
	// ServiceCIDRs are the CIDRs of the cluster's ServiceCIDR objects of this family, sorted.
	ServiceCIDRs []netip.Prefix
	// Services maps every proxied Service port of this family to its state.
	Services map[ServicePortName]*ServicePort

	// parent is the Generation this snapshot was derived from; changed lists the ports that differ from it
	// (including removed ones).
	parent  uint64
	changed []ServicePortName
}

// Sorted returns the Service ports ordered by name (a new slice; the ports are shared).
func (s *Snapshot) Sorted() []*ServicePort {
	out := make([]*ServicePort, 0, len(s.Services))
	for _, sp := range s.Services {
		out = append(out, sp)
	}
	slices.SortFunc(out, func(a, b *ServicePort) int { return a.Name.Compare(b.Name) })
	return out
}

// Changes returns the Service ports whose state differs between since and s, in name order: added, removed
// (absent from s.Services) and modified ones. since may be nil (everything in s is new). When s was built
// directly from since, this costs O(changes); otherwise it compares the two maps.
func (s *Snapshot) Changes(since *Snapshot) []ServicePortName {
	if since == nil {
		return slices.SortedFunc(maps.Keys(s.Services), ServicePortName.Compare)
	}
	if s.Generation == since.Generation+1 && since.Generation == s.parent && since.Family == s.Family {
		return s.changed
	}
	var out []ServicePortName
	for name, sp := range s.Services {
		if since.Services[name] != sp {
			out = append(out, name)
		}
	}
	for name := range since.Services {
		if _, ok := s.Services[name]; !ok {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, ServicePortName.Compare)
	return out
}

// builder derives successive snapshots of one family from the tracker's state.
type builder struct {
	family v1.IPFamily
	opts   serviceOptions
	last   *Snapshot
	// portsOf records, per Service, the ports it contributed to the last snapshot (pointers to the
	// snapshot's own: a name is 64 bytes, a pointer 8).
	portsOf map[serviceKey][]*ServicePort
}

func newBuilder(family v1.IPFamily, opts serviceOptions, nodeName string) *builder {
	return &builder{
		family:  family,
		opts:    opts,
		last:    &Snapshot{Family: family, Node: Node{Name: nodeName}, Services: map[ServicePortName]*ServicePort{}},
		portsOf: map[serviceKey][]*ServicePort{},
	}
}

// serviceInput is what the tracker hands the builder for one changed Service: its spec (nil when deleted)
// and its EndpointSlices.
type serviceInput struct {
	key    serviceKey
	svc    *serviceSpec
	slices []*parsedSlice
}

// servicePorts computes one Service's ports with their endpoints; a panic in doing so is returned as an
// error.
func (b *builder) servicePorts(in serviceInput, node Node, problems func(key serviceKey, msg string)) (ports []*ServicePort, err error) {
	defer func() {
		if r := recover(); r != nil {
			ports, err = nil, fmt.Errorf("panic: %v", r)
			klog.ErrorS(err, "Building a Service's rules panicked; it keeps its previous rules", "service", in.key.String(), "stack", string(debug.Stack()))
		}
	}()
	if in.svc == nil {
		return nil, nil
	}
	if servicePortsHook != nil {
		servicePortsHook(in.key)
	}
	ports, msgs := servicePorts(in.key, in.svc, b.family, b.opts)
	for _, m := range msgs {
		problems(in.key, m)
	}
	for _, sp := range ports {
		sp.Endpoints = endpointsFor(in.slices, b.family, sp.Name.Port, sp.Protocol)
		sel := SelectEndpoints(sp, sp.Endpoints, node.Name, node.Zone)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = sel.Cluster, sel.Local, sel.HasAny
	}
	return ports, nil
}

// servicePortsHook, set only by tests, runs before a Service's ports are computed (to make it panic).
var servicePortsHook func(key serviceKey)

// build returns the next snapshot: the last one with the given Services recomputed. Ports whose new state
// equals the old keep the old pointer, so they do not count as changed. problems collects unusable fields.
func (b *builder) build(node Node, serviceCIDRs []netip.Prefix, inputs []serviceInput, problems func(key serviceKey, msg string)) *Snapshot {
	prev := b.last
	next := &Snapshot{
		Family:       b.family,
		Generation:   prev.Generation + 1,
		Node:         node,
		ServiceCIDRs: serviceCIDRs,
		Services:     maps.Clone(prev.Services),
		parent:       prev.Generation,
	}
	// portsOf is updated once the whole snapshot is built, so that a build that never completes leaves the
	// builder as it was.
	portsOf := make(map[serviceKey][]*ServicePort, len(inputs))
	for _, in := range inputs {
		ports, err := b.servicePorts(in, node, problems)
		if err != nil {
			// A bug, not bad input (servicePorts reports and skips that): the Service keeps the state
			// of the last snapshot, and its next change tries again.
			problems(in.key, "skipped: building its rules panicked: "+err.Error())
			continue
		}
		kept := make([]*ServicePort, 0, len(ports))
		for _, sp := range ports {
			if old, ok := prev.Services[sp.Name]; ok && old.Equal(sp) {
				sp = old
			} else {
				next.changed = append(next.changed, sp.Name)
			}
			next.Services[sp.Name] = sp
			kept = append(kept, sp)
		}
		for _, old := range b.portsOf[in.key] {
			if !slices.ContainsFunc(kept, func(sp *ServicePort) bool { return sp.Name == old.Name }) {
				delete(next.Services, old.Name)
				next.changed = append(next.changed, old.Name)
			}
		}
		portsOf[in.key] = kept
	}
	for k, ports := range portsOf {
		if len(ports) == 0 {
			delete(b.portsOf, k)
		} else {
			b.portsOf[k] = ports
		}
	}
	slices.SortFunc(next.changed, ServicePortName.Compare)
	next.changed = slices.Compact(next.changed)
	b.last = next
	return next
}
