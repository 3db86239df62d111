package model

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// These tests pin the expectation itself to hand-worked cases, so that the e2e test compares the proxy
// with upstream's rules and not with a second copy of whatever the proxy does.

func ep(addr, node string, ready, serving, terminating bool) endpointView {
	return endpointView{Addr: addr, Node: node, Local: node == "me", Ready: ready, Serving: serving, Terminating: terminating}
}

func withZones(e endpointView, zones ...string) endpointView { e.ZoneHints = zones; return e }
func withNodes(e endpointView, nodes ...string) endpointView { e.NodeHints = nodes; return e }

func TestChoose(t *testing.T) {
	a := ep("10.0.0.1:80", "me", true, true, false)
	b := ep("10.0.0.2:80", "other", true, true, false)
	aTerm := ep("10.0.0.1:80", "me", false, true, true)
	bTerm := ep("10.0.0.2:80", "other", false, true, true)
	bGone := ep("10.0.0.2:80", "other", false, false, true)
	cases := []struct {
		name      string
		pv        portView
		eps       []endpointView
		zone      string
		wantC     []string
		wantUsesC bool
		wantL     []string
		wantUsesL bool
		wantAny   bool
	}{
		{name: "cluster policy, all ready", eps: []endpointView{a, b},
			wantUsesC: true, wantC: []string{a.Addr, b.Addr}, wantAny: true},
		{name: "no endpoints", wantUsesC: true, wantC: []string{}},
		{name: "none ready: serving-terminating fallback", eps: []endpointView{aTerm, bGone},
			wantUsesC: true, wantC: []string{aTerm.Addr}, wantAny: true},
		{name: "only not-serving terminating: nothing", eps: []endpointView{bGone}, wantUsesC: true, wantC: []string{}},
		{name: "zone hints for this zone", zone: "z1", eps: []endpointView{withZones(a, "z2"), withZones(b, "z1")},
			wantUsesC: true, wantC: []string{b.Addr}, wantAny: true},
		{name: "zone hints, one ready endpoint without: ignored", zone: "z1", eps: []endpointView{a, withZones(b, "z1")},
			wantUsesC: true, wantC: []string{a.Addr, b.Addr}, wantAny: true},
		{name: "zone hints, not-ready endpoint without: still used", zone: "z1", eps: []endpointView{withZones(a, "z1"), bTerm},
			wantUsesC: true, wantC: []string{a.Addr}, wantAny: true},
		{name: "zone hints for another zone only: ignored", zone: "z3", eps: []endpointView{withZones(a, "z1"), withZones(b, "z2")},
			wantUsesC: true, wantC: []string{a.Addr, b.Addr}, wantAny: true},
		{name: "node without zone: zone hints ignored", eps: []endpointView{withZones(a, "z1"), withZones(b, "z2")},
			wantUsesC: true, wantC: []string{a.Addr, b.Addr}, wantAny: true},
		{name: "node hints win over zone hints", zone: "z1",
			eps:       []endpointView{withNodes(withZones(a, "z2"), "me"), withNodes(withZones(b, "z1"), "other")},
			wantUsesC: true, wantC: []string{a.Addr}, wantAny: true},
		{name: "node hints for other nodes: zone hints apply", zone: "z1",
			eps:       []endpointView{withNodes(withZones(a, "z2"), "x"), withNodes(withZones(b, "z1"), "other")},
			wantUsesC: true, wantC: []string{b.Addr}, wantAny: true},
		{name: "ITP Local: only local, no cluster list", pv: portView{InternalLocal: true}, eps: []endpointView{a, b},
			wantUsesL: true, wantL: []string{a.Addr}, wantAny: true},
		{name: "ITP Local without local endpoints: dropped but HasAny", pv: portView{InternalLocal: true}, eps: []endpointView{b},
			wantUsesL: true, wantL: []string{}, wantAny: true},
		{name: "ITP Local, local terminating: local fallback", pv: portView{InternalLocal: true}, eps: []endpointView{aTerm, b},
			wantUsesL: true, wantL: []string{aTerm.Addr}, wantAny: true},
		{name: "ETP Local on a NodePort: both lists, local ignores hints", zone: "z1", pv: portView{ExternalLocal: true, NodePort: 30000},
			eps:       []endpointView{withZones(a, "z2"), withZones(b, "z1")},
			wantUsesC: true, wantC: []string{b.Addr}, wantUsesL: true, wantL: []string{a.Addr}, wantAny: true},
		{name: "ETP Local without node port, external or LB IP: not externally accessible", pv: portView{ExternalLocal: true},
			eps: []endpointView{a, b}, wantUsesC: true, wantC: []string{a.Addr, b.Addr}, wantAny: true},
		{name: "ETP Local with an external IP", pv: portView{ExternalLocal: true, ExternalIPs: []string{"192.0.2.1"}},
			eps: []endpointView{b}, wantUsesC: true, wantC: []string{b.Addr}, wantUsesL: true, wantL: []string{}, wantAny: true},
		{name: "ITP Local on a NodePort still uses cluster endpoints", pv: portView{InternalLocal: true, NodePort: 30000},
			eps: []endpointView{b}, wantUsesC: true, wantC: []string{b.Addr}, wantUsesL: true, wantL: []string{}, wantAny: true},
		{name: "ITP Local, only a non-serving endpoint: nothing anywhere", pv: portView{InternalLocal: true},
			eps: []endpointView{bGone}, wantUsesL: true, wantL: []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pv := tc.pv
			pv.Endpoints = tc.eps
			choose(&pv, "me", tc.zone)
			got := []any{pv.UsesCluster, pv.Cluster, pv.UsesLocal, pv.Local, pv.HasAny}
			want := []any{tc.wantUsesC, tc.wantC, tc.wantUsesL, tc.wantL, tc.wantAny}
			if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("[usesCluster cluster usesLocal local hasAny] (-want +got):\n%s", d)
			}
		})
	}
}

func slice(ns, name, svc string, typ discovery.AddressType, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: typ, Ports: ports, Endpoints: eps,
	}
}

func port(name string, proto v1.Protocol, n *int32) discovery.EndpointPort {
	return discovery.EndpointPort{Name: ref(name), Protocol: ref(proto), Port: n}
}

func TestEndpointsOf(t *testing.T) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	ready := func(ip string) discovery.Endpoint {
		return discovery.Endpoint{Addresses: []string{ip}, NodeName: ref("me")}
	}
	terminating := func(ip string) discovery.Endpoint {
		e := ready(ip)
		e.Conditions = discovery.EndpointConditions{Ready: ref(false), Serving: ref(true), Terminating: ref(true)}
		return e
	}
	http := []discovery.EndpointPort{port("http", v1.ProtocolTCP, ref(int32(8080)))}
	o := &objects{nodeName: "me", slices: []*discovery.EndpointSlice{
		// The terminating copy of .9 comes first, the ready one later: the ready one is kept.
		slice("ns", "web-a", "web", discovery.AddressTypeIPv4, http, terminating("10.0.0.9"), ready("10.0.0.10")),
		slice("ns", "web-b", "web", discovery.AddressTypeIPv4, http, ready("10.0.0.9"), ready("10.0.0.10")),
		// The ready copy of .11 first, the terminating one later: still the ready one.
		slice("ns", "web-c", "web", discovery.AddressTypeIPv4, http, ready("10.0.0.11")),
		slice("ns", "web-d", "web", discovery.AddressTypeIPv4, http, terminating("10.0.0.11")),
		// Not for this port: another name, another protocol, no number, number 0.
		slice("ns", "web-e", "web", discovery.AddressTypeIPv4, []discovery.EndpointPort{
			port("dns", v1.ProtocolTCP, ref(int32(53))), port("http", v1.ProtocolUDP, ref(int32(80))),
			port("http", v1.ProtocolTCP, nil),
		}, ready("10.0.0.20")),
		slice("ns", "web-f", "web", discovery.AddressTypeIPv4, []discovery.EndpointPort{port("http", v1.ProtocolTCP, ref(int32(0)))}, ready("10.0.0.21")),
		// Not for this Service or family.
		slice("other", "web-g", "web", discovery.AddressTypeIPv4, http, ready("10.0.0.30")),
		slice("ns", "api-a", "api", discovery.AddressTypeIPv4, http, ready("10.0.0.31")),
		slice("ns", "web-v6", "web", discovery.AddressTypeIPv6, http, ready("fd00::1")),
		slice("ns", "web-fqdn", "web", discovery.AddressTypeFQDN, http, ready("example.com")),
	}}
	got := endpointsOf(o, svc, v1.IPv4Protocol, "http", v1.ProtocolTCP)
	want := []endpointView{
		{Addr: "10.0.0.10:8080", Ready: true, Serving: true, Node: "me", Local: true},
		{Addr: "10.0.0.11:8080", Ready: true, Serving: true, Node: "me", Local: true},
		{Addr: "10.0.0.9:8080", Ready: true, Serving: true, Node: "me", Local: true},
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("IPv4 endpoints (-want +got):\n%s", d)
	}
	got = endpointsOf(o, svc, v1.IPv6Protocol, "http", v1.ProtocolTCP)
	if len(got) != 1 || got[0].Addr != "[fd00::1]:8080" {
		t.Errorf("IPv6 endpoints = %+v, want only [fd00::1]:8080", got)
	}
}

func TestExpectFiltersAndFields(t *testing.T) {
	svc := func(name string, tweak func(*v1.Service)) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00::10"},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
				Ports:      []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
		}
		tweak(s)
		return s
	}
	o := &objects{nodeName: "me", services: []*v1.Service{
		svc("plain", func(*v1.Service) {}),
		svc("headless", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		}),
		svc("extname", func(s *v1.Service) {
			s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = v1.ServiceTypeExternalName, "", nil, nil
		}),
		svc("other-proxy", func(s *v1.Service) { s.Labels = map[string]string{labelServiceProxyName: ""} }),
		svc("v6only", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "fd00::11", []string{"fd00::11"}, []v1.IPFamily{v1.IPv6Protocol}
		}),
		svc("lb", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/32"}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ref(int32(60))}}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.1"}, {IP: "198.51.100.2", IPMode: ref(v1.LoadBalancerIPModeProxy)},
				{IP: "2001:db8::1", IPMode: ref(v1.LoadBalancerIPModeVIP)}}
		}),
	}}
	got := expect(o, v1.IPv4Protocol)
	want := familyView{Ports: map[string]portView{
		"ns/plain/TCP": {ClusterIP: "10.96.0.10", Port: 80, UsesCluster: true},
		"ns/lb/TCP": {ClusterIP: "10.96.0.10", Port: 80, NodePort: 30080, LoadBalancerIPs: []string{"198.51.100.1"},
			SourceRanges: []string{"192.0.2.0/24"}, StickySeconds: 60, ExternalLocal: true, HealthCheckNodePort: 32000,
			UsesCluster: true, UsesLocal: true},
	}}
	if d := diffViews(want, got); d != "" {
		t.Errorf("IPv4 (-want +got):\n%s", d)
	}
	got = expect(o, v1.IPv6Protocol)
	if _, ok := got.Ports["ns/v6only/TCP"]; !ok || len(got.Ports) != 3 {
		t.Errorf("IPv6 ports = %v, want plain, v6only and lb", keys(got.Ports))
	}
	if lb := got.Ports["ns/lb/TCP"]; lb.ClusterIP != "fd00::10" || !cmp.Equal(lb.LoadBalancerIPs, []string{"2001:db8::1"}) ||
		!cmp.Equal(lb.SourceRanges, []string{"2001:db8::/32"}) {
		t.Errorf("IPv6 lb = %+v", lb)
	}
}

func keys(m map[string]portView) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
