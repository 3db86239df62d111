package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

const thisNode = "node-a"

func TestParseSlice(t *testing.T) {
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	ipv4, ipv6 := discovery.AddressTypeIPv4, discovery.AddressTypeIPv6
	trigger := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)

	tests := []struct {
		name     string
		slice    *discovery.EndpointSlice
		nodeName string
		want     *parsedSlice
		problems []string
	}{
		{
			name:  "FQDN slices are ignored",
			slice: makeSlice("ns", "svc", "s1", discovery.AddressTypeFQDN, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "example.com"}),
		},
		{
			name: "condition defaults: nil ready and serving are true, nil terminating is false",
			slice: makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("http", 80, tcp)},
				epSpec{ip: "10.0.0.1"},
				epSpec{ip: "10.0.0.2", ready: ptr(false), serving: ptr(true), terminating: ptr(true)},
				epSpec{ip: "10.0.0.3", ready: ptr(false), serving: ptr(false), terminating: ptr(false)},
			),
			nodeName: thisNode,
			want: &parsedSlice{name: "s1", family: v1.IPv4Protocol,
				ports: []slicePort{{name: "http", protocol: tcp, port: 80}},
				endpoints: []Endpoint{
					{IP: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true},
					{IP: netip.MustParseAddr("10.0.0.2"), Serving: true, Terminating: true},
					{IP: netip.MustParseAddr("10.0.0.3")},
				}},
		},
		{
			name: "node, zone, hints (sorted) and isLocal",
			slice: makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("", 80, tcp)},
				epSpec{ip: "10.0.0.1", node: thisNode, zone: "z1", zoneHints: []string{"z2", "z1"}, nodeHints: []string{"n2", "n1"}},
				epSpec{ip: "10.0.0.2", node: "node-b", zone: "z2", zoneHints: []string{}},
				epSpec{ip: "10.0.0.3"},
			),
			nodeName: thisNode,
			want: &parsedSlice{name: "s1", family: v1.IPv4Protocol,
				ports: []slicePort{{protocol: tcp, port: 80}},
				endpoints: []Endpoint{
					{IP: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true, NodeName: thisNode, Zone: "z1",
						Hints: &Hints{Zones: []string{"z1", "z2"}, Nodes: []string{"n1", "n2"}}, IsLocal: true},
					{IP: netip.MustParseAddr("10.0.0.2"), Ready: true, Serving: true, NodeName: "node-b", Zone: "z2"},
					{IP: netip.MustParseAddr("10.0.0.3"), Ready: true, Serving: true},
				}},
		},
		{
			name: "no endpoint is local when the node name is unknown",
			slice: makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("", 80, tcp)},
				epSpec{ip: "10.0.0.1", node: ""},
			),
			nodeName: "",
			want: &parsedSlice{name: "s1", family: v1.IPv4Protocol,
				ports:     []slicePort{{protocol: tcp, port: 80}},
				endpoints: []Endpoint{{IP: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true}}},
		},
		{
			name: "wrong-family, unparsable and missing addresses are skipped and reported",
			slice: makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("", 80, tcp)},
				epSpec{ip: "fd00::1"},
				epSpec{ip: "10.0.0.1"},
				epSpec{ip: "10.0.0.999"},
				epSpec{},
				epSpec{ip: "010.000.000.002"},
			),
			want: &parsedSlice{name: "s1", family: v1.IPv4Protocol,
				ports: []slicePort{{protocol: tcp, port: 80}},
				endpoints: []Endpoint{
					{IP: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true},
					{IP: netip.MustParseAddr("10.0.0.2"), Ready: true, Serving: true},
				}},
			problems: []string{"endpoints[0].addresses[0]", "endpoints[2].addresses[0]", "endpoints[3].addresses"},
		},
		{
			name:  "an IPv4 address in an IPv6 slice is skipped",
			slice: makeSlice("ns", "svc", "s1", ipv6, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1"}, epSpec{ip: "fd00::1"}),
			want: &parsedSlice{name: "s1", family: v1.IPv6Protocol,
				ports:     []slicePort{{protocol: tcp, port: 80}},
				endpoints: []Endpoint{{IP: netip.MustParseAddr("fd00::1"), Ready: true, Serving: true}}},
			problems: []string{"endpoints[0].addresses[0]"},
		},
		{
			name: "missing and out-of-range ports are reported; nil name is \"\", nil protocol TCP",
			slice: makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{
				{name: ptr("a")},
				{name: ptr("b"), port: ptr[int32](0), proto: ptr(tcp)},
				{name: ptr("c"), port: ptr[int32](65536), proto: ptr(tcp)},
				{port: ptr[int32](53), proto: ptr(udp)},
				{name: ptr("d"), port: ptr[int32](8080)},
			}, epSpec{ip: "10.0.0.1"}),
			want: &parsedSlice{name: "s1", family: v1.IPv4Protocol,
				ports:     []slicePort{{protocol: udp, port: 53}, {name: "d", protocol: tcp, port: 8080}},
				endpoints: []Endpoint{{IP: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true}}},
			problems: []string{"ports[0].port", "ports[1].port", "ports[2].port"},
		},
		{
			name: "trigger time annotation",
			slice: func() *discovery.EndpointSlice {
				es := makeSlice("ns", "svc", "s1", ipv4, nil)
				es.Annotations = map[string]string{AnnotationLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
				return es
			}(),
			want: &parsedSlice{name: "s1", family: v1.IPv4Protocol, triggerTime: trigger},
		},
		{
			name: "bad trigger time annotation is reported",
			slice: func() *discovery.EndpointSlice {
				es := makeSlice("ns", "svc", "s1", ipv4, nil)
				es.Annotations = map[string]string{AnnotationLastChangeTriggerTime: "yesterday"}
				return es
			}(),
			want:     &parsedSlice{name: "s1", family: v1.IPv4Protocol},
			problems: []string{AnnotationLastChangeTriggerTime},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := parseSlice(tc.slice, tc.nodeName)
			if got != nil && got.final {
				// A one-port slice comes with its endpoints as a snapshot uses them; check that, then
				// compare the facts.
				if len(got.ports) != 1 || !slices.IsSortedFunc(got.endpoints, func(a, b Endpoint) int { return cmpString(a.Addr, b.Addr) }) {
					t.Errorf("final parsed slice with ports %v, endpoints not sorted: %v", got.ports, epAddrs(got.endpoints))
				}
				for i := range got.endpoints {
					e := &got.endpoints[i]
					if want := NewEndpoint(e.IP, got.ports[0].port); e.Port != want.Port || e.Addr != want.Addr {
						t.Errorf("final endpoint %v has port %d, addr %q", e.IP, e.Port, e.Addr)
					}
					e.Port, e.Addr = 0, ""
				}
				got.final = false
			}
			if diff := cmp.Diff(tc.want, got, netipCmp, cmp.AllowUnexported(parsedSlice{}, slicePort{})); diff != "" {
				t.Errorf("parsed slice (-want +got):\n%s", diff)
			}
			if len(problems) != len(tc.problems) {
				t.Fatalf("problems = %q, want %d matching %q", problems, len(tc.problems), tc.problems)
			}
			for i, p := range problems {
				if !strings.Contains(p, tc.problems[i]) {
					t.Errorf("problem %d = %q, want it to name %q", i, p, tc.problems[i])
				}
			}
		})
	}
}

func TestSliceService(t *testing.T) {
	es := makeSlice("ns", "web", "web-abc", discovery.AddressTypeIPv4, nil)
	got, err := sliceService(es)
	if err != nil || got != nn("ns", "web") {
		t.Errorf("sliceService = %v, %v; want ns/web", got, err)
	}
	delete(es.Labels, discovery.LabelServiceName)
	if _, err := sliceService(es); err == nil {
		t.Errorf("sliceService without the service-name label: want an error")
	}
}

// endpointView is what TestEndpointsFor compares: the fields merging decides.
type endpointView struct {
	Addr        string
	Ready       bool
	Terminating bool
	Node        string
}

func views(eps []Endpoint) []endpointView {
	var out []endpointView
	for _, e := range eps {
		out = append(out, endpointView{Addr: e.Addr, Ready: e.Ready, Terminating: e.Terminating, Node: e.NodeName})
	}
	return out
}

func TestEndpointsFor(t *testing.T) {
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	ipv4, ipv6 := discovery.AddressTypeIPv4, discovery.AddressTypeIPv6
	notReady := ptr(false)
	term := ptr(true)

	tests := []struct {
		name     string
		slices   []*discovery.EndpointSlice
		family   v1.IPFamily
		portName string
		protocol v1.Protocol
		want     []endpointView
	}{
		{
			name: "several slices merge, sorted by the ip:port string",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("http", 80, tcp)}, epSpec{ip: "10.0.0.9"}, epSpec{ip: "10.0.0.10"}),
				makeSlice("ns", "svc", "s2", ipv4, []slicePortSpec{sp("http", 80, tcp)}, epSpec{ip: "10.0.0.2"}),
			},
			family: v1.IPv4Protocol, portName: "http", protocol: tcp,
			want: []endpointView{
				{Addr: "10.0.0.10:80", Ready: true},
				{Addr: "10.0.0.2:80", Ready: true},
				{Addr: "10.0.0.9:80", Ready: true},
			},
		},
		{
			name: "duplicate across slices: non-terminating wins (terminating first)",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1", ready: notReady, terminating: term, node: "old"}),
				makeSlice("ns", "svc", "s2", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1", node: "new"}),
			},
			family: v1.IPv4Protocol, protocol: tcp,
			want: []endpointView{{Addr: "10.0.0.1:80", Ready: true, Node: "new"}},
		},
		{
			name: "duplicate across slices: non-terminating wins (terminating last)",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1", node: "new"}),
				makeSlice("ns", "svc", "s2", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1", ready: notReady, terminating: term, node: "old"}),
			},
			family: v1.IPv4Protocol, protocol: tcp,
			want: []endpointView{{Addr: "10.0.0.1:80", Ready: true, Node: "new"}},
		},
		{
			name: "duplicate within one slice collapses",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1"}, epSpec{ip: "10.0.0.1"}),
			},
			family: v1.IPv4Protocol, protocol: tcp,
			want: []endpointView{{Addr: "10.0.0.1:80", Ready: true}},
		},
		{
			name: "same IP with different port numbers in different slices stays two endpoints",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: "10.0.0.1"}),
				makeSlice("ns", "svc", "s2", ipv4, []slicePortSpec{sp("http", 8081, tcp)}, epSpec{ip: "10.0.0.1"}),
			},
			family: v1.IPv4Protocol, portName: "http", protocol: tcp,
			want: []endpointView{{Addr: "10.0.0.1:8080", Ready: true}, {Addr: "10.0.0.1:8081", Ready: true}},
		},
		{
			name: "port resolved by name and protocol",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4,
					[]slicePortSpec{sp("dns", 5353, udp), sp("dns", 5354, tcp), sp("metrics", 9153, tcp)},
					epSpec{ip: "10.0.0.1"}),
			},
			family: v1.IPv4Protocol, portName: "dns", protocol: tcp,
			want: []endpointView{{Addr: "10.0.0.1:5354", Ready: true}},
		},
		{
			name: "no slice port with that name yields nothing",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s1", ipv4, []slicePortSpec{sp("http", 80, tcp)}, epSpec{ip: "10.0.0.1"}),
			},
			family: v1.IPv4Protocol, portName: "https", protocol: tcp,
		},
		{
			name: "slices of the other family are ignored",
			slices: []*discovery.EndpointSlice{
				makeSlice("ns", "svc", "s4", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.0.0.1"}),
				makeSlice("ns", "svc", "s6", ipv6, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "fd00::2"}, epSpec{ip: "fd00::10"}),
			},
			family: v1.IPv6Protocol, protocol: tcp,
			want: []endpointView{{Addr: "[fd00::10]:80", Ready: true}, {Addr: "[fd00::2]:80", Ready: true}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var parsed []*parsedSlice
			for _, es := range tc.slices {
				ps, problems := parseSlice(es, thisNode)
				if len(problems) > 0 {
					t.Fatalf("unexpected problems: %q", problems)
				}
				parsed = append(parsed, ps)
			}
			got := endpointsFor(parsed, tc.family, tc.portName, tc.protocol)
			if diff := cmp.Diff(tc.want, views(got)); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			for _, e := range got {
				if want := netip.AddrPortFrom(e.IP, uint16(e.Port)).String(); e.Addr != want || e.String() != want {
					t.Errorf("endpoint %+v: Addr %q, want %q", e, e.Addr, want)
				}
			}
		})
	}
}

// TestEndpointsForDoesNotAlias checks that the per-port endpoints do not share memory with the parsed
// slice (which is reused for every port and every later snapshot).
func TestEndpointsForDoesNotAlias(t *testing.T) {
	es := makeSlice("ns", "svc", "s1", discovery.AddressTypeIPv4,
		[]slicePortSpec{sp("a", 80, v1.ProtocolTCP), sp("b", 81, v1.ProtocolTCP)},
		epSpec{ip: "10.0.0.1", zoneHints: []string{"z"}})
	ps, _ := parseSlice(es, thisNode)
	a := endpointsFor([]*parsedSlice{ps}, v1.IPv4Protocol, "a", v1.ProtocolTCP)
	b := endpointsFor([]*parsedSlice{ps}, v1.IPv4Protocol, "b", v1.ProtocolTCP)
	if a[0].Port != 80 || b[0].Port != 81 || ps.endpoints[0].Port != 0 || ps.endpoints[0].Addr != "" {
		t.Errorf("ports leaked between merges: a=%+v b=%+v parsed=%+v", a[0], b[0], ps.endpoints[0])
	}
}

// TestEndpointsForSharesOneSlice: the endpoints of a port served by one one-port slice are that slice's own
// (no copy per snapshot), unless the slice lists an endpoint twice, which is merged as usual.
func TestEndpointsForSharesOneSlice(t *testing.T) {
	one := makeSlice("ns", "svc", "s1", discovery.AddressTypeIPv4, []slicePortSpec{sp("a", 80, v1.ProtocolTCP)},
		epSpec{ip: "10.0.0.9"}, epSpec{ip: "10.0.0.10"})
	ps, _ := parseSlice(one, thisNode)
	got := endpointsFor([]*parsedSlice{ps}, v1.IPv4Protocol, "a", v1.ProtocolTCP)
	if !slices.Equal(epAddrs(got), []string{"10.0.0.10:80", "10.0.0.9:80"}) || &got[0] != &ps.endpoints[0] {
		t.Errorf("one one-port slice: got %v, shared %v", epAddrs(got), len(got) > 0 && &got[0] == &ps.endpoints[0])
	}
	dup := makeSlice("ns", "svc", "s1", discovery.AddressTypeIPv4, []slicePortSpec{sp("a", 80, v1.ProtocolTCP)},
		epSpec{ip: "10.0.0.1", terminating: ptr(true)}, epSpec{ip: "10.0.0.1"})
	ps, _ = parseSlice(dup, thisNode)
	got = endpointsFor([]*parsedSlice{ps}, v1.IPv4Protocol, "a", v1.ProtocolTCP)
	if len(got) != 1 || got[0].Terminating {
		t.Errorf("a slice listing an endpoint twice: got %+v, want one non-terminating", got)
	}
}

func TestServicePortEqual(t *testing.T) {
	base := func() *ServicePort {
		p := wantPort("ns", "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080)
		p.ExternalIPs = addrs("192.0.2.1")
		p.Endpoints = []Endpoint{NewEndpoint(netip.MustParseAddr("10.1.0.1"), 8080)}
		p.Endpoints[0].Ready, p.Endpoints[0].Serving, p.Endpoints[0].Hints = true, true, &Hints{Zones: []string{"z1"}}
		p.ClusterEndpoints = p.Endpoints
		p.HasAnyEndpoints = true
		return p
	}
	changes := map[string]func(*ServicePort){
		"clusterIP":       func(p *ServicePort) { p.ClusterIP = netip.MustParseAddr("10.0.0.2") },
		"nodePort":        func(p *ServicePort) { p.NodePort = 0 },
		"externalIPs":     func(p *ServicePort) { p.ExternalIPs = nil },
		"lbIPs":           func(p *ServicePort) { p.LoadBalancerIPs = addrs("192.0.2.2") },
		"sourceRanges":    func(p *ServicePort) { p.LoadBalancerSourceRanges = prefixes("10.0.0.0/8") },
		"sticky":          func(p *ServicePort) { p.StickyMaxAgeSeconds = 10 },
		"etp":             func(p *ServicePort) { p.ExternalPolicyLocal = true },
		"itp":             func(p *ServicePort) { p.InternalPolicyLocal = true },
		"hcNodePort":      func(p *ServicePort) { p.HealthCheckNodePort = 3 },
		"distribution":    func(p *ServicePort) { p.TrafficDistribution = "PreferClose" },
		"hasAny":          func(p *ServicePort) { p.HasAnyEndpoints = false },
		"endpoint ready":  func(p *ServicePort) { p.Endpoints = []Endpoint{p.Endpoints[0]}; p.Endpoints[0].Ready = false },
		"endpoint hints":  func(p *ServicePort) { p.Endpoints = []Endpoint{p.Endpoints[0]}; p.Endpoints[0].Hints = nil },
		"endpoint local":  func(p *ServicePort) { p.Endpoints = []Endpoint{p.Endpoints[0]}; p.Endpoints[0].IsLocal = true },
		"cluster eps":     func(p *ServicePort) { p.ClusterEndpoints = []Endpoint{} },
		"local eps used":  func(p *ServicePort) { p.LocalEndpoints = []Endpoint{} },
		"endpoint port":   func(p *ServicePort) { p.Endpoints = []Endpoint{NewEndpoint(netip.MustParseAddr("10.1.0.1"), 8081)} },
		"endpoint zone":   func(p *ServicePort) { p.Endpoints = []Endpoint{p.Endpoints[0]}; p.Endpoints[0].Zone = "z9" },
		"endpoint node":   func(p *ServicePort) { p.Endpoints = []Endpoint{p.Endpoints[0]}; p.Endpoints[0].NodeName = "n9" },
		"endpoint serves": func(p *ServicePort) { p.Endpoints = []Endpoint{p.Endpoints[0]}; p.Endpoints[0].Serving = false },
	}
	if a, b := base(), base(); !a.Equal(b) {
		t.Fatalf("identical ports are not Equal")
	}
	for name, change := range changes {
		a, b := base(), base()
		change(b)
		if a.Equal(b) || b.Equal(a) {
			t.Errorf("changing %s: ports still Equal", name)
		}
	}
}

// TestInterner: equal strings share one copy, up to the bound; past it strings are returned unchanged.
func TestInterner(t *testing.T) {
	in := interner{max: 2}
	a := in.intern(string([]byte("node-a")))
	b := in.intern(string([]byte("node-a")))
	if a != "node-a" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Errorf("two copies of node-a: %p %p", unsafe.StringData(a), unsafe.StringData(b))
	}
	in.intern("node-b")
	c1 := string([]byte("node-c"))
	if c2 := in.intern(c1); c2 != "node-c" || unsafe.StringData(c2) != unsafe.StringData(c1) || len(in.m) != 2 {
		t.Errorf("past the bound: %q, %d entries", c2, len(in.m))
	}
	// parseSlice shares node and zone names between endpoints of different slices.
	es1 := makeSlice("ns", "web", "web-1", ipv4, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: "10.1.0.1", node: string([]byte("node-x")), zone: string([]byte("zone-x"))})
	es2 := makeSlice("ns", "web", "web-2", ipv4, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: "10.1.0.2", node: string([]byte("node-x")), zone: string([]byte("zone-x"))})
	p1, _ := parseSlice(es1, thisNode)
	p2, _ := parseSlice(es2, thisNode)
	if unsafe.StringData(p1.endpoints[0].NodeName) != unsafe.StringData(p2.endpoints[0].NodeName) ||
		unsafe.StringData(p1.endpoints[0].Zone) != unsafe.StringData(p2.endpoints[0].Zone) {
		t.Error("endpoints of two slices hold their own copies of a node or zone name")
	}
}
