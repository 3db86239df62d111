package proxy

import (
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

var (
	tcp  = v1.ProtocolTCP
	ipv4 = discovery.AddressTypeIPv4
	ipv6 = discovery.AddressTypeIPv6
)

// newTestTracker returns a tracker for thisNode and the given families, counting OnChange calls.
func newTestTracker(families ...v1.IPFamily) (*Tracker, *atomic.Int64, *problemLog) {
	var changes atomic.Int64
	log := &problemLog{}
	t := NewTracker(TrackerOptions{
		NodeName:    thisNode,
		Families:    families,
		ExternalIPs: true,
		OnChange:    func() { changes.Add(1) },
		Problems:    log.sink,
	})
	return t, &changes, log
}

func webService(tweaks ...func(*v1.Service)) *v1.Service {
	return makeService("ns", "web", "10.0.0.10", append([]func(*v1.Service){withPort("http", tcp, 80, 0)}, tweaks...)...)
}

func webSlice(name string, ips ...string) *discovery.EndpointSlice {
	var eps []epSpec
	for _, ip := range ips {
		eps = append(eps, epSpec{ip: ip})
	}
	return makeSlice("ns", "web", name, ipv4, []slicePortSpec{sp("http", 8080, tcp)}, eps...)
}

func only(b Build) *Snapshot {
	if len(b.Snapshots) != 1 {
		panic("want one snapshot")
	}
	return b.Snapshots[0]
}

// TestTrackerChanges feeds event sequences after an initial state has been snapshotted, and checks which
// ports the next snapshot reports as changed and what is still pending.
func TestTrackerChanges(t *testing.T) {
	web := spn("ns", "web", "http", tcp)
	other := spn("ns", "other", "", tcp)
	otherSvc := makeService("ns", "other", "10.0.0.11", withPort("", tcp, 81, 0))
	otherSlice := makeSlice("ns", "other", "other-1", ipv4, []slicePortSpec{sp("", 9090, tcp)}, epSpec{ip: "10.1.1.1"})

	tests := []struct {
		name string
		// initial events, snapshotted before the test events
		initial func(tr *Tracker)
		events  func(tr *Tracker)
		// wantChanged are the ports Changes(prev) reports; wantPorts the ports in the new snapshot with
		// their endpoint addresses.
		wantChanged []ServicePortName
		wantPorts   map[ServicePortName][]string
		// wantPending are Pending() right before the snapshot; wantOnChange the OnChange calls of events.
		wantPending  [2]int
		wantOnChange int64
	}{
		{
			name: "add Service and slice",
			events: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1", "10.1.0.2"))
			},
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{web: {"10.1.0.1:8080", "10.1.0.2:8080"}},
			wantPending:  [2]int{1, 1},
			wantOnChange: 2,
		},
		{
			name: "add then delete a Service before a sync leaves nothing",
			events: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnService(webService(), nil)
			},
			wantPorts:    map[ServicePortName][]string{},
			wantPending:  [2]int{0, 0},
			wantOnChange: 2,
		},
		{
			name:    "update, then update back, before a sync leaves no change",
			initial: func(tr *Tracker) { tr.OnService(nil, webService()) },
			events: func(tr *Tracker) {
				tr.OnService(webService(), webService(withPort("extra", tcp, 81, 0)))
				tr.OnService(webService(withPort("extra", tcp, 81, 0)), webService())
			},
			wantPorts:    map[ServicePortName][]string{web: {}},
			wantPending:  [2]int{0, 0},
			wantOnChange: 2,
		},
		{
			name: "a slice relabelled to another Service leaves the first",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnService(nil, otherSvc)
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
			},
			events: func(tr *Tracker) {
				moved := makeSlice("ns", "other", "web-1", ipv4, []slicePortSpec{sp("", 9090, tcp)}, epSpec{ip: "10.1.0.1"})
				tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), moved)
			},
			wantChanged:  []ServicePortName{other, web},
			wantPorts:    map[ServicePortName][]string{web: {}, other: {"10.1.0.1:9090"}},
			wantPending:  [2]int{0, 2},
			wantOnChange: 1, // leaving one Service and joining the other is one event

		},
		{
			name:    "add then delete a slice before a sync leaves no change",
			initial: func(tr *Tracker) { tr.OnService(nil, webService()) },
			events: func(tr *Tracker) {
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
				tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), nil)
			},
			wantPorts:    map[ServicePortName][]string{web: {}},
			wantPending:  [2]int{0, 1},
			wantOnChange: 2,
		},
		{
			name: "update of resourceVersion, annotations and other labels only: nothing changes",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
			},
			events: func(tr *Tracker) {
				tr.OnService(webService(), webService(func(s *v1.Service) {
					s.ResourceVersion = "2"
					s.Annotations = map[string]string{"a": "b"}
					s.Labels = map[string]string{"app": "web"}
				}))
				es := webSlice("web-1", "10.1.0.1")
				es.ResourceVersion = "2"
				es.Annotations = map[string]string{"x": "y"}
				tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), es)
			},
			wantPorts:   map[ServicePortName][]string{web: {"10.1.0.1:8080"}},
			wantPending: [2]int{0, 0},
		},
		{
			name: "resync (same objects again) changes nothing",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
			},
			events: func(tr *Tracker) {
				tr.OnService(webService(), webService())
				tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), webSlice("web-1", "10.1.0.1"))
			},
			wantPorts:   map[ServicePortName][]string{web: {"10.1.0.1:8080"}},
			wantPending: [2]int{0, 0},
		},
		{
			name: "endpoint change marks only that Service",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
				tr.OnService(nil, otherSvc)
				tr.OnEndpointSlice(nil, otherSlice)
			},
			events: func(tr *Tracker) {
				tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), webSlice("web-1", "10.1.0.1", "10.1.0.3"))
			},
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{web: {"10.1.0.1:8080", "10.1.0.3:8080"}, other: {"10.1.1.1:9090"}},
			wantPending:  [2]int{0, 1},
			wantOnChange: 1,
		},
		{
			name: "a readiness change is a change",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1", "10.1.0.2"))
			},
			events: func(tr *Tracker) {
				es := webSlice("web-1", "10.1.0.1", "10.1.0.2")
				es.Endpoints[1].Conditions.Ready = ptr(false)
				tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1", "10.1.0.2"), es)
			},
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{web: {"10.1.0.1:8080", "10.1.0.2:8080"}},
			wantPending:  [2]int{0, 1},
			wantOnChange: 1,
		},
		{
			name: "a second slice merges in",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
			},
			events: func(tr *Tracker) {
				tr.OnEndpointSlice(nil, webSlice("web-2", "10.1.0.1", "10.1.0.0"))
			},
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{web: {"10.1.0.0:8080", "10.1.0.1:8080"}},
			wantPending:  [2]int{0, 1},
			wantOnChange: 1,
		},
		{
			name: "port renamed: old removed, new added",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
			},
			events: func(tr *Tracker) {
				s := webService()
				s.Spec.Ports[0].Name = "web"
				tr.OnService(webService(), s)
			},
			wantChanged:  []ServicePortName{web, spn("ns", "web", "web", tcp)}, // "http" < "web"
			wantPorts:    map[ServicePortName][]string{spn("ns", "web", "web", tcp): {}},
			wantPending:  [2]int{1, 0},
			wantOnChange: 1,
		},
		{
			name: "Service deleted: its ports are removed, slices kept for later",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
				tr.OnService(nil, otherSvc)
			},
			events:       func(tr *Tracker) { tr.OnService(webService(), nil) },
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{other: {}},
			wantPending:  [2]int{1, 0},
			wantOnChange: 1,
		},
		{
			name: "service-proxy-name label added: ports removed",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
			},
			events: func(tr *Tracker) {
				tr.OnService(webService(), webService(func(s *v1.Service) {
					s.Labels = map[string]string{LabelServiceProxyName: "other-proxy"}
				}))
			},
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{},
			wantPending:  [2]int{1, 0},
			wantOnChange: 1,
		},
		{
			name:    "slices for an unknown Service wait for it",
			initial: func(tr *Tracker) { tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1")) },
			events: func(tr *Tracker) {
				tr.OnService(nil, webService())
			},
			wantChanged:  []ServicePortName{web},
			wantPorts:    map[ServicePortName][]string{web: {"10.1.0.1:8080"}},
			wantPending:  [2]int{1, 0},
			wantOnChange: 1,
		},
		{
			name:    "a slice without the service-name label is ignored",
			initial: func(tr *Tracker) { tr.OnService(nil, webService()) },
			events: func(tr *Tracker) {
				es := webSlice("web-1", "10.1.0.1")
				es.Labels = nil
				tr.OnEndpointSlice(nil, es)
			},
			wantPorts: map[ServicePortName][]string{web: {}},
		},
		{
			name:    "deleting an unknown slice is a no-op",
			initial: func(tr *Tracker) { tr.OnService(nil, webService()) },
			events: func(tr *Tracker) {
				tr.OnEndpointSlice(webSlice("web-9", "10.1.0.9"), nil)
			},
			wantPorts: map[ServicePortName][]string{web: {}},
		},
		{
			name: "an IPv6 slice on an IPv4-only tracker changes nothing visible",
			initial: func(tr *Tracker) {
				tr.OnService(nil, webService())
				tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
			},
			events: func(tr *Tracker) {
				tr.OnEndpointSlice(nil, makeSlice("ns", "web", "web-v6", ipv6, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: "fd00::1"}))
			},
			wantPorts:    map[ServicePortName][]string{web: {"10.1.0.1:8080"}},
			wantPending:  [2]int{0, 1},
			wantOnChange: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, onChange, _ := newTestTracker(v1.IPv4Protocol)
			if tc.initial != nil {
				tc.initial(tr)
			}
			prev := only(tr.Snapshots())
			prevPorts := maps.Clone(prev.Services)
			onChange.Store(0)

			tc.events(tr)
			if got := onChange.Load(); got != tc.wantOnChange {
				t.Errorf("OnChange called %d times, want %d", got, tc.wantOnChange)
			}
			s, e := tr.Pending()
			if [2]int{s, e} != tc.wantPending {
				t.Errorf("Pending() = %d, %d; want %v", s, e, tc.wantPending)
			}
			next := only(tr.Snapshots())
			if s, e := tr.Pending(); s != 0 || e != 0 {
				t.Errorf("Pending() after Snapshots = %d, %d; want 0, 0", s, e)
			}

			changed := next.Changes(prev)
			if diff := cmp.Diff(tc.wantChanged, changed); diff != "" {
				t.Errorf("Changes(prev) (-want +got):\n%s", diff)
			}
			// The fast path must agree with a full comparison.
			if diff := cmp.Diff(slowChanges(prev, next), changed); diff != "" {
				t.Errorf("Changes fast path disagrees with a full comparison (-slow +fast):\n%s", diff)
			}
			got := map[ServicePortName][]string{}
			for name, p := range next.Services {
				got[name] = epAddrs(p.Endpoints)
				if got[name] == nil {
					got[name] = []string{}
				}
			}
			if diff := cmp.Diff(tc.wantPorts, got); diff != "" {
				t.Errorf("ports and endpoints (-want +got):\n%s", diff)
			}
			// Unchanged ports keep their pointer; changed ones get a new one.
			for name, p := range next.Services {
				old, ok := prevPorts[name]
				if wasChanged := slices.Contains(changed, name); ok && (old == p) == wasChanged {
					t.Errorf("%s: pointer kept = %v, but reported changed = %v", name, old == p, wasChanged)
				}
			}
			// The previous snapshot is untouched.
			if diff := cmp.Diff(prevPorts, prev.Services); diff != "" {
				t.Errorf("previous snapshot modified:\n%s", diff)
			}
		})
	}
}

// slowChanges compares two snapshots' maps by pointer.
func slowChanges(a, b *Snapshot) []ServicePortName {
	var out []ServicePortName
	for name, p := range b.Services {
		if a.Services[name] != p {
			out = append(out, name)
		}
	}
	for name := range a.Services {
		if _, ok := b.Services[name]; !ok {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, ServicePortName.Compare)
	return out
}

func TestSnapshotChanges(t *testing.T) {
	tr, _, _ := newTestTracker(v1.IPv4Protocol)
	a := spn("ns", "a", "", tcp)
	b := spn("ns", "b", "", tcp)
	c := spn("ns", "c", "", tcp)
	tr.OnService(nil, makeService("ns", "a", "10.0.0.1", withPort("", tcp, 80, 0)))
	tr.OnService(nil, makeService("ns", "b", "10.0.0.2", withPort("", tcp, 80, 0)))
	s1 := only(tr.Snapshots())
	if diff := cmp.Diff([]ServicePortName{a, b}, s1.Changes(nil)); diff != "" {
		t.Errorf("Changes(nil) (-want +got):\n%s", diff)
	}

	tr.OnService(nil, makeService("ns", "c", "10.0.0.3", withPort("", tcp, 80, 0)))
	s2 := only(tr.Snapshots())
	tr.OnService(makeService("ns", "a", "10.0.0.1", withPort("", tcp, 80, 0)), nil)
	s3 := only(tr.Snapshots())
	s4 := only(tr.Snapshots()) // nothing pending

	tests := []struct {
		name       string
		from, to   *Snapshot
		want       []ServicePortName
		generation uint64
	}{
		{"consecutive (fast path)", s1, s2, []ServicePortName{c}, 2},
		{"consecutive removal", s2, s3, []ServicePortName{a}, 3},
		{"non-consecutive (slow path)", s1, s3, []ServicePortName{a, c}, 3},
		{"nothing pending", s3, s4, nil, 4},
		{"same snapshot", s3, s3, nil, 3},
		{"backwards", s3, s1, []ServicePortName{a, c}, 1},
	}
	for _, tc := range tests {
		if tc.to.Generation != tc.generation {
			t.Errorf("%s: generation %d, want %d", tc.name, tc.to.Generation, tc.generation)
		}
		if diff := cmp.Diff(tc.want, tc.to.Changes(tc.from)); diff != "" {
			t.Errorf("%s: Changes (-want +got):\n%s", tc.name, diff)
		}
	}
	if got := s3.Sorted(); len(got) != 2 || got[0].Name != b || got[1].Name != c {
		t.Errorf("Sorted() = %v, want b, c", got)
	}
}

// TestTrackerZoneChange checks that a change of this node's zone label recomputes topology for every
// Service, and only those whose selection depends on it change.
func TestTrackerZoneChange(t *testing.T) {
	tr, onChange, _ := newTestTracker(v1.IPv4Protocol)
	hinted := spn("ns", "hinted", "", tcp)
	plain := spn("ns", "plain", "", tcp)
	tr.OnService(nil, makeService("ns", "hinted", "10.0.0.1", withPort("", tcp, 80, 0)))
	tr.OnService(nil, makeService("ns", "plain", "10.0.0.2", withPort("", tcp, 80, 0)))
	tr.OnEndpointSlice(nil, makeSlice("ns", "hinted", "h1", ipv4, []slicePortSpec{sp("", 80, tcp)},
		epSpec{ip: "10.1.0.1", zone: "zone-a", zoneHints: z("zone-a")},
		epSpec{ip: "10.1.0.2", zone: "zone-b", zoneHints: z("zone-b")}))
	tr.OnEndpointSlice(nil, makeSlice("ns", "plain", "p1", ipv4, []slicePortSpec{sp("", 80, tcp)},
		epSpec{ip: "10.2.0.1", zone: "zone-a"}, epSpec{ip: "10.2.0.2", zone: "zone-b"}))
	tr.OnNode(makeNode(thisNode, "zone-a", []string{"InternalIP=192.168.0.1"}))
	s1 := only(tr.Snapshots())
	if got := epAddrs(s1.Services[hinted].ClusterEndpoints); !slices.Equal(got, []string{"10.1.0.1:80"}) {
		t.Fatalf("zone-a cluster endpoints = %v", got)
	}
	if s1.Node.Zone != "zone-a" {
		t.Errorf("snapshot zone = %q", s1.Node.Zone)
	}

	onChange.Store(0)
	tr.OnNode(makeNode(thisNode, "zone-b", []string{"InternalIP=192.168.0.1"}))
	if onChange.Load() != 1 {
		t.Errorf("zone change: OnChange called %d times, want 1", onChange.Load())
	}
	s2 := only(tr.Snapshots())
	if got := epAddrs(s2.Services[hinted].ClusterEndpoints); !slices.Equal(got, []string{"10.1.0.2:80"}) {
		t.Errorf("zone-b cluster endpoints = %v", got)
	}
	if diff := cmp.Diff([]ServicePortName{hinted}, s2.Changes(s1)); diff != "" {
		t.Errorf("Changes after zone change (-want +got):\n%s", diff)
	}
	if s2.Services[plain] != s1.Services[plain] {
		t.Errorf("unhinted Service got a new pointer")
	}

	// Losing the label (or the Node) turns topology off.
	tr.OnNode(nil)
	s3 := only(tr.Snapshots())
	if got := epAddrs(s3.Services[hinted].ClusterEndpoints); !slices.Equal(got, []string{"10.1.0.1:80", "10.1.0.2:80"}) {
		t.Errorf("no-zone cluster endpoints = %v", got)
	}
	if s3.Node.Known || s3.Node.Zone != "" || s3.Node.Name != thisNode {
		t.Errorf("node after deletion = %+v", s3.Node)
	}

	// A Node update that changes nothing the proxy uses does not ask for a sync.
	tr.OnNode(makeNode(thisNode, "zone-b", []string{"InternalIP=192.168.0.1"}))
	tr.Snapshots()
	onChange.Store(0)
	n := makeNode(thisNode, "zone-b", []string{"InternalIP=192.168.0.1"})
	n.ResourceVersion = "9"
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	tr.OnNode(n)
	if onChange.Load() != 0 {
		t.Errorf("irrelevant Node update: OnChange called %d times, want 0", onChange.Load())
	}
}

func TestNodeFacts(t *testing.T) {
	tests := []struct {
		name   string
		node   *v1.Node
		family v1.IPFamily
		want   Node
	}{
		{
			name:   "unknown node",
			family: v1.IPv4Protocol,
			want:   Node{Name: thisNode},
		},
		{
			name: "InternalIP before ExternalIP, per family, duplicates and hostnames dropped",
			node: makeNode(thisNode, "z", []string{
				"ExternalIP=203.0.113.5", "Hostname=node-a", "InternalIP=2001:db8::5", "InternalIP=192.168.0.5",
				"ExternalIP=2001:db8:ff::5", "InternalIP=192.168.0.6", "ExternalIP=192.168.0.5", "InternalIP=bogus",
			}, "10.244.1.0/24", "fd00:10:244:1::/64"),
			family: v1.IPv4Protocol,
			want: Node{Name: thisNode, Known: true, Zone: "z",
				IPs:      addrs("192.168.0.5", "192.168.0.6", "203.0.113.5"),
				PodCIDRs: prefixes("10.244.1.0/24")},
		},
		{
			name: "IPv6 facts of a dual-stack node",
			node: makeNode(thisNode, "", []string{
				"ExternalIP=2001:db8:ff::5", "InternalIP=192.168.0.5", "InternalIP=2001:db8::5",
			}, "10.244.1.0/24", "fd00:10:244:1::/64"),
			family: v1.IPv6Protocol,
			want: Node{Name: thisNode, Known: true,
				IPs:      addrs("2001:db8::5", "2001:db8:ff::5"),
				PodCIDRs: prefixes("fd00:10:244:1::/64")},
		},
		{
			name: "legacy podCIDR only",
			node: func() *v1.Node {
				n := makeNode(thisNode, "", []string{"InternalIP=192.168.0.5"})
				n.Spec.PodCIDR = "10.244.7.0/24"
				return n
			}(),
			family: v1.IPv4Protocol,
			want:   Node{Name: thisNode, Known: true, IPs: addrs("192.168.0.5"), PodCIDRs: prefixes("10.244.7.0/24")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := nodeFor(tc.node, thisNode, tc.family)
			if diff := cmp.Diff(tc.want, got, netipCmp); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if !got.Equal(&tc.want) {
				t.Errorf("Equal reports a difference for identical facts")
			}
		})
	}
	a := nodeFor(makeNode(thisNode, "z", []string{"InternalIP=192.168.0.5"}), thisNode, v1.IPv4Protocol)
	for name, change := range map[string]func(*Node){
		"name":  func(n *Node) { n.Name = "x" },
		"known": func(n *Node) { n.Known = false },
		"zone":  func(n *Node) { n.Zone = "y" },
		"ips":   func(n *Node) { n.IPs = addrs("192.168.0.6") },
		"cidrs": func(n *Node) { n.PodCIDRs = prefixes("10.0.0.0/8") },
	} {
		b := a
		b.IPs, b.PodCIDRs = slices.Clone(a.IPs), slices.Clone(a.PodCIDRs)
		change(&b)
		if a.Equal(&b) {
			t.Errorf("Node.Equal misses a change of %s", name)
		}
	}
}

// TestTrackerNodeInSnapshots checks the node facts each family's snapshot carries.
func TestTrackerNodeInSnapshots(t *testing.T) {
	tr, _, _ := newTestTracker(v1.IPv6Protocol, v1.IPv4Protocol)
	tr.OnNode(makeNode(thisNode, "z1", []string{"InternalIP=192.168.0.5", "InternalIP=fd00::5"}, "10.244.1.0/24", "fd00:244::/64"))
	b := tr.Snapshots()
	if len(b.Snapshots) != 2 || b.Snapshots[0].Family != v1.IPv6Protocol || b.Snapshots[1].Family != v1.IPv4Protocol {
		t.Fatalf("want IPv6 then IPv4 snapshots, got %d", len(b.Snapshots))
	}
	if got := b.Snapshots[0].Node.IPs; !slices.Equal(got, addrs("fd00::5")) {
		t.Errorf("IPv6 node IPs = %v", got)
	}
	if got := b.Snapshots[1].Node.PodCIDRs; !slices.Equal(got, prefixes("10.244.1.0/24")) {
		t.Errorf("IPv4 pod CIDRs = %v", got)
	}
	if got := tr.Node(); got == nil || got.Name != thisNode {
		t.Errorf("Node() = %v", got)
	}
	if diff := cmp.Diff([]v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}, tr.Families()); diff != "" {
		t.Errorf("Families: %s", diff)
	}
}

func TestTrackerStatsAndProblems(t *testing.T) {
	tr, _, log := newTestTracker(v1.IPv4Protocol)
	tr.OnService(nil, webService())
	tr.OnService(webService(), webService()) // no-op update
	tr.OnService(nil, webService(func(s *v1.Service) { s.Name = "bad"; s.Spec.ExternalIPs = []string{"nope"} }))
	tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1", "fd00::1")) // wrong family address
	tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1", "fd00::1"), webSlice("web-1", "10.1.0.1", "fd00::1"))
	es := webSlice("web-x", "10.1.0.1")
	es.Labels = nil
	tr.OnEndpointSlice(nil, es) // no service-name label: not counted as a change

	if got, want := tr.Stats(), (TrackerStats{ServiceChanges: 3, EndpointChanges: 2}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	if s, e := tr.Pending(); s != 2 || e != 1 {
		t.Errorf("Pending() = %d, %d; want 2, 1", s, e)
	}
	// The wrong-family address is reported once (the second event is a resync of the same content), the
	// unlabelled slice once.
	if got := log.count("EndpointSlice"); got != 2 {
		t.Errorf("EndpointSlice problems = %d, want 2", got)
	}
	snap := only(tr.Snapshots())
	if got := log.count("Service"); got != 1 {
		t.Errorf("Service problems = %d, want 1 (the bad external IP)", got)
	}
	if p := snap.Services[spn("ns", "bad", "http", tcp)]; p == nil || len(p.ExternalIPs) != 0 {
		t.Errorf("Service with a bad external IP: want it proxied without it, got %+v", p)
	}
	if got := epAddrs(snap.Services[spn("ns", "web", "http", tcp)].Endpoints); !slices.Equal(got, []string{"10.1.0.1:8080"}) {
		t.Errorf("endpoints = %v, want the good one only", got)
	}
}

func TestTrackerTriggerTimes(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	withTrigger := func(es *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
		es.Annotations = map[string]string{AnnotationLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
		return es
	}
	v6Slice := func(ip string) *discovery.EndpointSlice {
		return makeSlice("ns", "web", "web-v6", ipv6, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: ip})
	}
	t1, t2, t3 := start.Add(time.Second), start.Add(2*time.Second), start.Add(3*time.Second)

	tr, _, _ := newTestTracker(v1.IPv4Protocol, v1.IPv6Protocol)
	tr.start = start
	tr.OnService(nil, webService(dualStack("10.0.0.10", "fd00::10")))
	tr.OnEndpointSlice(nil, withTrigger(webSlice("old", "10.1.0.9"), start.Add(-time.Hour))) // before start: ignored
	tr.OnEndpointSlice(nil, withTrigger(webSlice("web-1", "10.1.0.1"), t1))
	tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), withTrigger(webSlice("web-1", "10.1.0.1"), t1)) // same content: not again
	tr.OnEndpointSlice(nil, withTrigger(v6Slice("fd00::1"), t2))
	tr.OnEndpointSlice(nil, webSlice("no-annotation", "10.1.0.3"))

	b := tr.Snapshots()
	want := map[v1.IPFamily][]time.Time{v1.IPv4Protocol: {t1}, v1.IPv6Protocol: {t2}}
	if diff := cmp.Diff(want, b.Triggers); diff != "" {
		t.Errorf("triggers (-want +got):\n%s", diff)
	}
	// A failed apply puts them back; they come out again with the next build's own.
	tr.RequeueTriggers(Build{Triggers: map[v1.IPFamily][]time.Time{v1.IPv6Protocol: b.Triggers[v1.IPv6Protocol]}})
	tr.OnEndpointSlice(v6Slice("fd00::1"), withTrigger(v6Slice("fd00::2"), t3))
	b = tr.Snapshots()
	want = map[v1.IPFamily][]time.Time{v1.IPv6Protocol: {t2, t3}}
	if diff := cmp.Diff(want, b.Triggers); diff != "" {
		t.Errorf("triggers after requeue (-want +got):\n%s", diff)
	}
	if b = tr.Snapshots(); len(b.Triggers) != 0 {
		t.Errorf("triggers are handed out once, got %v again", b.Triggers)
	}
}

// TestTrackerDualStack checks that each family's snapshot has its own cluster IP and endpoints, and that a
// single-stack Service appears only in its family.
func TestTrackerDualStack(t *testing.T) {
	tr, _, log := newTestTracker(v1.IPv4Protocol, v1.IPv6Protocol)
	tr.OnService(nil, webService(dualStack("fd00::10", "10.0.0.10")))
	tr.OnService(nil, makeService("ns", "v4only", "10.0.0.11", withPort("", tcp, 80, 0)))
	tr.OnEndpointSlice(nil, webSlice("web-v4", "10.1.0.1"))
	tr.OnEndpointSlice(nil, makeSlice("ns", "web", "web-v6", ipv6, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: "fd00:1::1"}))
	b := tr.Snapshots()
	v4, v6 := b.Snapshots[0], b.Snapshots[1]
	web := spn("ns", "web", "http", tcp)
	if p := v4.Services[web]; p == nil || p.ClusterIP != netip.MustParseAddr("10.0.0.10") || !slices.Equal(epAddrs(p.Endpoints), []string{"10.1.0.1:8080"}) {
		t.Errorf("IPv4 port = %+v", p)
	}
	if p := v6.Services[web]; p == nil || p.ClusterIP != netip.MustParseAddr("fd00::10") || !slices.Equal(epAddrs(p.Endpoints), []string{"[fd00:1::1]:8080"}) {
		t.Errorf("IPv6 port = %+v", p)
	}
	if len(v4.Services) != 2 || len(v6.Services) != 1 {
		t.Errorf("ports: IPv4 %d (want 2), IPv6 %d (want 1)", len(v4.Services), len(v6.Services))
	}
	if n := len(log.kinds); n != 0 {
		t.Errorf("a dual-stack setup reported %d problems", n)
	}
}

// TestTrackerGolden renders the snapshots of a varied set of objects, for review of the whole model.
func TestTrackerGolden(t *testing.T) {
	tr, _, _ := newTestTracker(v1.IPv4Protocol, v1.IPv6Protocol)
	tr.OnNode(makeNode(thisNode, "zone-a", []string{"InternalIP=192.168.0.5", "InternalIP=fd00::5", "ExternalIP=203.0.113.5"},
		"10.244.1.0/24", "fd00:244:1::/64"))
	local := v1.ServiceInternalTrafficPolicyLocal
	tr.OnService(nil, makeService("default", "kubernetes", "10.96.0.1", withPort("https", tcp, 443, 0)))
	tr.OnService(nil, makeService("shop", "front", "", dualStack("10.96.0.20", "fd00:96::20"),
		withPort("http", tcp, 80, 30080), withPort("dns", v1.ProtocolUDP, 53, 30053),
		func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.ExternalIPs = []string{"198.51.100.7", "2001:db8:7::7"}
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "2001:db8::/32"}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.50"}, {IP: "2001:db8:50::1"}, {IP: "192.0.2.51", IPMode: ptr(v1.LoadBalancerIPModeProxy)}}
		}))
	tr.OnService(nil, makeService("shop", "cart", "10.96.0.30", withPort("", tcp, 8080, 0), func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = &local
		s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose)
	}))
	tr.OnService(nil, makeService("shop", "headless", v1.ClusterIPNone, withPort("", tcp, 80, 0)))
	tr.OnEndpointSlice(nil, makeSlice("default", "kubernetes", "kubernetes", ipv4, []slicePortSpec{sp("https", 6443, tcp)},
		epSpec{ip: "192.168.0.1"}))
	tr.OnEndpointSlice(nil, makeSlice("shop", "front", "front-v4-a", ipv4,
		[]slicePortSpec{sp("http", 8080, tcp), sp("dns", 5353, v1.ProtocolUDP)},
		epSpec{ip: "10.244.1.10", node: thisNode, zone: "zone-a", zoneHints: z("zone-a")},
		epSpec{ip: "10.244.2.10", node: "node-b", zone: "zone-b", zoneHints: z("zone-b")},
		epSpec{ip: "10.244.1.11", node: thisNode, zone: "zone-a", ready: ptr(false), serving: ptr(true), terminating: ptr(true), zoneHints: z("zone-a")}))
	tr.OnEndpointSlice(nil, makeSlice("shop", "front", "front-v6-a", ipv6,
		[]slicePortSpec{sp("http", 8080, tcp), sp("dns", 5353, v1.ProtocolUDP)},
		epSpec{ip: "fd00:244:2::10", node: "node-b", zone: "zone-b"}))
	tr.OnEndpointSlice(nil, makeSlice("shop", "cart", "cart-1", ipv4, []slicePortSpec{sp("", 8080, tcp)},
		epSpec{ip: "10.244.2.20", node: "node-b"},
		epSpec{ip: "10.244.1.20", node: thisNode, ready: ptr(false), serving: ptr(true), terminating: ptr(true)}))
	tr.OnEndpointSlice(nil, makeSlice("shop", "headless", "headless-1", ipv4, []slicePortSpec{sp("", 80, tcp)},
		epSpec{ip: "10.244.1.99"}))
	b := tr.Snapshots()
	golden(t, "snapshot_ipv4.golden", dumpSnapshot(b.Snapshots[0]))
	golden(t, "snapshot_ipv6.golden", dumpSnapshot(b.Snapshots[1]))
}

// TestTrackerSurvivesMalformedObjects feeds objects the API server would not normally produce; none may
// crash the tracker, and what is usable is still proxied.
func TestTrackerSurvivesMalformedObjects(t *testing.T) {
	tr, _, log := newTestTracker(v1.IPv4Protocol, v1.IPv6Protocol)
	tr.OnService(nil, nil)
	tr.OnEndpointSlice(nil, nil)
	tr.OnService(nil, &v1.Service{})
	tr.OnService(nil, makeService("ns", "noports", "10.0.0.1"))
	tr.OnService(nil, makeService("ns", "weird", "", func(s *v1.Service) {
		s.Spec.ClusterIP = "10.0.0.2"
		s.Spec.ClusterIPs = []string{"10.0.0.2"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} // more families than IPs
		s.Spec.Ports = []v1.ServicePort{{Name: "p", Port: 80}}
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{} // no clientIP
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{}}
	}))
	tr.OnEndpointSlice(nil, &discovery.EndpointSlice{})
	empty := makeSlice("ns", "weird", "empty", ipv4, nil)
	empty.Endpoints = []discovery.Endpoint{{}, {Addresses: []string{""}}, {Addresses: []string{"10.1.0.1"}, Hints: &discovery.EndpointHints{}}}
	empty.Ports = []discovery.EndpointPort{{}, {Name: ptr("p"), Port: ptr[int32](8080)}}
	tr.OnEndpointSlice(nil, empty)
	tr.OnNode(&v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "x"}}},
		Spec: v1.NodeSpec{PodCIDRs: []string{"nope", "10.0.0.0/99"}}})
	b := tr.Snapshots()
	p := b.Snapshots[0].Services[spn("ns", "weird", "p", tcp)]
	if p == nil || !slices.Equal(epAddrs(p.Endpoints), []string{"10.1.0.1:8080"}) || p.StickyMaxAgeSeconds != 10800 {
		t.Errorf("usable parts of a weird Service: %+v", p)
	}
	if len(b.Snapshots[1].Services) != 0 {
		t.Errorf("IPv6 ports from a Service without an IPv6 cluster IP: %v", b.Snapshots[1].Services)
	}
	if n := log.count("EndpointSlice"); n < 3 {
		t.Errorf("only %d EndpointSlice problems reported", n)
	}
}

// TestTrackerReplace: a relist records every listed object and deletes the ones no longer listed, the
// slices by the Service they were recorded under (their labels are gone with them).
func TestTrackerReplace(t *testing.T) {
	tr, _, _ := newTestTracker(v1.IPv4Protocol)
	other := makeService("ns", "other", "10.0.0.11", withPort("http", tcp, 80, 0))
	tr.ReplaceServices([]*v1.Service{webService(), other})
	otherSlice := makeSlice("ns", "other", "other-1", ipv4, []slicePortSpec{sp("http", 9090, tcp)}, epSpec{ip: "10.1.0.9"})
	tr.ReplaceEndpointSlices([]*discovery.EndpointSlice{webSlice("web-1", "10.1.0.1"), webSlice("web-2", "10.1.0.2"), otherSlice})
	snap := only(tr.Snapshots())
	web, oth := spn("ns", "web", "http", tcp), spn("ns", "other", "http", tcp)
	if got := epAddrs(snap.Services[web].Endpoints); !slices.Equal(got, []string{"10.1.0.1:8080", "10.1.0.2:8080"}) {
		t.Fatalf("web endpoints after the first list = %v", got)
	}

	// The relist no longer has Service other, nor slice web-2.
	tr.ReplaceServices([]*v1.Service{webService()})
	tr.ReplaceEndpointSlices([]*discovery.EndpointSlice{webSlice("web-1", "10.1.0.1"), otherSlice})
	snap = only(tr.Snapshots())
	if snap.Services[oth] != nil {
		t.Errorf("Service other survived a relist without it")
	}
	if got := epAddrs(snap.Services[web].Endpoints); !slices.Equal(got, []string{"10.1.0.1:8080"}) {
		t.Errorf("web endpoints after the relist = %v, want web-2's gone", got)
	}
	if s, e := tr.Pending(); s != 0 || e != 0 {
		t.Errorf("Pending() after the snapshot = %d, %d", s, e)
	}
	// Relisting the same content again changes nothing.
	tr.ReplaceServices([]*v1.Service{webService()})
	tr.ReplaceEndpointSlices([]*discovery.EndpointSlice{webSlice("web-1", "10.1.0.1"), otherSlice})
	if s, e := tr.Pending(); s != 0 || e != 0 {
		t.Errorf("Pending() after an identical relist = %d, %d", s, e)
	}
	if changed := only(tr.Snapshots()).Changes(snap); len(changed) != 0 {
		t.Errorf("an identical relist changed %v", changed)
	}
}

// TestTrackerSliceLosesItsLabel: a slice whose Service label is removed leaves its Service, is reported
// once however often it is seen again, and is forgotten when deleted.
func TestTrackerSliceLosesItsLabel(t *testing.T) {
	tr, changes, log := newTestTracker(v1.IPv4Protocol)
	tr.OnService(nil, webService())
	tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
	_ = tr.Snapshots()
	before := changes.Load()
	unlabelled := webSlice("web-1", "10.1.0.1")
	unlabelled.Labels = nil
	for range 3 {
		tr.OnEndpointSlice(nil, unlabelled)
	}
	if got := changes.Load() - before; got != 1 {
		t.Errorf("OnChange called %d times, want once (leaving the Service)", got)
	}
	if got := log.count("EndpointSlice"); got != 1 {
		t.Errorf("reported %d times, want once", got)
	}
	snap := only(tr.Snapshots())
	if got := epAddrs(snap.Services[spn("ns", "web", "http", tcp)].Endpoints); len(got) != 0 {
		t.Errorf("web still has the unlabelled slice's endpoints %v", got)
	}
	tr.OnEndpointSlice(unlabelled, nil)
	tr.OnEndpointSlice(nil, unlabelled) // seen again after its deletion: reported again
	if got := log.count("EndpointSlice"); got != 2 {
		t.Errorf("reported %d times, want twice", got)
	}
}

// TestTrackerServiceCIDRs checks that the ServiceCIDRs reach each family's snapshot, sorted and without
// duplicates, and that only a real change asks for a sync.
func TestTrackerServiceCIDRs(t *testing.T) {
	tr, changes, _ := newTestTracker(v1.IPv4Protocol, v1.IPv6Protocol)
	tr.OnServiceCIDRs([]string{"fd00:96::/112", "10.97.0.0/16", "10.96.0.0/16", "bogus", "10.96.0.0/16"})
	if changes.Load() != 1 {
		t.Errorf("changes = %d, want 1", changes.Load())
	}
	tr.OnServiceCIDRs([]string{"10.96.0.0/16", "fd00:96::/112", "10.97.0.0/16"})
	if changes.Load() != 1 {
		t.Errorf("the same CIDRs in another order asked for a sync (changes = %d)", changes.Load())
	}
	b := tr.Snapshots()
	want := map[v1.IPFamily][]netip.Prefix{
		v1.IPv4Protocol: {netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.97.0.0/16")},
		v1.IPv6Protocol: {netip.MustParsePrefix("fd00:96::/112")},
	}
	for _, s := range b.Snapshots {
		if !slices.Equal(s.ServiceCIDRs, want[s.Family]) {
			t.Errorf("%s ServiceCIDRs = %v, want %v", s.Family, s.ServiceCIDRs, want[s.Family])
		}
	}
}

// TestTrackerPanicInOneServiceKeepsTheOthers: a bug that panics while one Service's ports are built skips
// that Service (it keeps its last rules, and is reported) and not the rest of the snapshot; its next change
// is built again.
func TestTrackerPanicInOneServiceKeepsTheOthers(t *testing.T) {
	tr, _, log := newTestTracker(v1.IPv4Protocol)
	tr.OnService(nil, webService())
	tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
	only(tr.Snapshots())
	servicePortsHook = func(k serviceKey) {
		if k.Name == "web" {
			panic("a bug")
		}
	}
	t.Cleanup(func() { servicePortsHook = nil })
	tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), webSlice("web-1", "10.1.0.2"))
	tr.OnService(nil, makeService("ns", "api", "10.0.0.11", withPort("http", tcp, 80, 0)))
	s := only(tr.Snapshots())
	if web := s.Services[spn("ns", "web", "http", tcp)]; web == nil || !slices.Equal(epAddrs(web.Endpoints), []string{"10.1.0.1:8080"}) {
		t.Errorf("the Service whose build panicked: %v, want its last state (10.1.0.1:8080)", web)
	}
	if s.Services[spn("ns", "api", "http", tcp)] == nil {
		t.Error("another Service changed in the same snapshot is missing")
	}
	if log.count("Service") != 1 {
		t.Errorf("%d Service problems reported, want 1", log.count("Service"))
	}
	servicePortsHook = nil
	tr.OnEndpointSlice(webSlice("web-1", "10.1.0.2"), webSlice("web-1", "10.1.0.3"))
	s = only(tr.Snapshots())
	if web := s.Services[spn("ns", "web", "http", tcp)]; web == nil || !slices.Equal(epAddrs(web.Endpoints), []string{"10.1.0.3:8080"}) {
		t.Errorf("after its next change, the Service is %v, want 10.1.0.3:8080", web)
	}
}

// TestTrackerPanicKeepsPendingChanges: when building a snapshot panics outside any one Service (the sync
// loop recovers it and retries), the changes it had taken are not lost: the next snapshot has them, with
// their trigger times.
func TestTrackerPanicKeepsPendingChanges(t *testing.T) {
	var boom atomic.Bool
	tr := NewTracker(TrackerOptions{NodeName: thisNode, Families: []v1.IPFamily{v1.IPv4Protocol}, ExternalIPs: true, OnChange: func() {},
		Problems: func(string) {
			if boom.Load() {
				panic("a bug in the problem sink")
			}
		}})
	tr.start = time.Now().Add(-time.Hour)
	tr.Snapshots()
	tr.OnService(nil, webService())
	es := webSlice("web-1", "10.1.0.1")
	es.Annotations = map[string]string{AnnotationLastChangeTriggerTime: time.Now().Add(-time.Minute).Format(time.RFC3339Nano)}
	tr.OnEndpointSlice(nil, es)
	// A Service with a bad external IP is reported while the snapshot is built: here the report panics,
	// and so does the report of that panic, which escapes the Service's own recovery.
	tr.OnService(nil, webService(func(s *v1.Service) { s.Name = "bad"; s.Spec.ExternalIPs = []string{"nope"} }))
	boom.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Snapshots did not panic")
			}
		}()
		tr.Snapshots()
	}()
	boom.Store(false)
	if svc, eps := tr.Pending(); svc == 0 || eps == 0 {
		t.Errorf("after the panic, pending changes: %d Services, %d endpoints; want them kept", svc, eps)
	}
	b := tr.Snapshots()
	web := only(b).Services[spn("ns", "web", "http", tcp)]
	if web == nil || !slices.Equal(epAddrs(web.Endpoints), []string{"10.1.0.1:8080"}) {
		t.Errorf("after the panic, the next snapshot has web = %v, want 10.1.0.1:8080", web)
	}
	if len(b.Triggers[v1.IPv4Protocol]) != 1 {
		t.Errorf("trigger times after the panic: %v, want the slice's", b.Triggers)
	}
}

// TestTrackerQuietAboutSlicesOfServicesItDoesNotProxy: slices of another proxy's Service (the controller
// copies the Service's service-proxy-name label onto them) and slices whose Service is not (yet) known
// are not reported as unusable objects; a slice that gains the label leaves the Service it fed.
func TestTrackerQuietAboutSlicesOfServicesItDoesNotProxy(t *testing.T) {
	tr, _, log := newTestTracker(v1.IPv4Protocol)
	tr.OnService(nil, webService())
	tr.OnEndpointSlice(nil, webSlice("web-1", "10.1.0.1"))
	other := makeSlice("ns", "mesh", "mesh-1", ipv4, []slicePortSpec{sp("http", 80, tcp)}, epSpec{ip: "10.1.0.2"})
	other.Labels[LabelServiceProxyName] = "mesh-proxy"
	tr.OnEndpointSlice(nil, other)
	tr.OnEndpointSlice(nil, makeSlice("ns", "later", "later-1", ipv4, []slicePortSpec{sp("http", 80, tcp)}, epSpec{ip: "10.1.0.3"}))
	s := only(tr.Snapshots())
	if n := log.count("EndpointSlice"); n != 0 {
		t.Errorf("%d EndpointSlice problems reported for slices of Services not proxied here, want 0", n)
	}
	if len(s.Services) != 1 {
		t.Errorf("Services %v, want web only", s.Services)
	}
	moved := webSlice("web-1", "10.1.0.1")
	moved.Labels[LabelServiceProxyName] = "mesh-proxy"
	tr.OnEndpointSlice(webSlice("web-1", "10.1.0.1"), moved)
	s = only(tr.Snapshots())
	if web := s.Services[spn("ns", "web", "http", tcp)]; web == nil || len(web.Endpoints) != 0 {
		t.Errorf("after its slice was labelled for another proxy, web = %+v, want no endpoints", web)
	}
	if n := log.count("EndpointSlice"); n != 0 {
		t.Errorf("%d EndpointSlice problems reported, want 0", n)
	}
}
