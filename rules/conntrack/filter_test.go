package conntrack

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
)

func TestStale(t *testing.T) {
	ep := func(addr string, serving bool) proxy.Endpoint {
		ap := netip.MustParseAddrPort(addr)
		e := proxy.NewEndpoint(ap.Addr(), int32(ap.Port()))
		e.Ready, e.Serving = serving, serving
		return e
	}
	name := func(n string, p v1.Protocol) proxy.ServicePortName {
		return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: n}, Protocol: p}
	}
	snap := &proxy.Snapshot{Family: v1.IPv4Protocol, Services: map[proxy.ServicePortName]*proxy.ServicePort{
		name("dns", v1.ProtocolUDP): {Name: name("dns", v1.ProtocolUDP), ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53,
			Protocol: v1.ProtocolUDP, NodePort: 30053, ExternalIPs: []netip.Addr{netip.MustParseAddr("203.0.113.5")},
			Endpoints: []proxy.Endpoint{ep("10.244.1.2:5353", true), ep("10.244.2.2:5353", false)}},
		name("empty", v1.ProtocolUDP): {Name: name("empty", v1.ProtocolUDP), ClusterIP: netip.MustParseAddr("10.96.0.11"), Port: 53,
			Protocol: v1.ProtocolUDP, NodePort: 30054},
		name("web", v1.ProtocolTCP): {Name: name("web", v1.ProtocolTCP), ClusterIP: netip.MustParseAddr("10.96.0.12"), Port: 80,
			Protocol: v1.ProtocolTCP, Endpoints: []proxy.Endpoint{ep("10.244.1.2:80", true)}},
	}}
	s := NewStale(snap)
	flow := func(dst, replySrc string) Flow {
		return Flow{Protocol: protoUDP, OrigDst: netip.MustParseAddrPort(dst), ReplySrc: netip.MustParseAddrPort(replySrc)}
	}
	for _, tc := range []struct {
		name  string
		flow  Flow
		stale bool
	}{
		{"to a serving endpoint", flow("10.96.0.10:53", "10.244.1.2:5353"), false},
		{"to a non-serving endpoint", flow("10.96.0.10:53", "10.244.2.2:5353"), true},
		{"to a removed endpoint", flow("10.96.0.10:53", "10.244.9.9:5353"), true},
		{"not DNATed while the Service had no endpoints", flow("10.96.0.10:53", "10.96.0.10:53"), true},
		{"external IP to a removed endpoint", flow("203.0.113.5:53", "10.244.9.9:5353"), true},
		{"NodePort to a removed endpoint", flow("192.0.2.10:30053", "10.244.9.9:5353"), true},
		{"NodePort to a serving endpoint", flow("192.0.2.10:30053", "10.244.1.2:5353"), false},
		{"NodePort of a Service without endpoints is left alone", flow("192.0.2.10:30054", "192.0.2.10:30054"), false},
		{"cluster IP of a Service without endpoints", flow("10.96.0.11:53", "10.96.0.11:53"), true},
		{"unrelated flow", flow("8.8.8.8:53", "8.8.8.8:53"), false},
		{"TCP is never touched", Flow{Protocol: 6, OrigDst: netip.MustParseAddrPort("10.96.0.12:80"), ReplySrc: netip.MustParseAddrPort("10.244.9.9:80")}, false},
	} {
		if got := s.IsStale(tc.flow); got != tc.stale {
			t.Errorf("%s: IsStale = %v, want %v", tc.name, got, tc.stale)
		}
	}
	if s.Empty() {
		t.Error("Empty with UDP Services")
	}
	if !Affected([]proxy.ServicePortName{name("dns", v1.ProtocolUDP)}) || Affected([]proxy.ServicePortName{name("web", v1.ProtocolTCP)}) {
		t.Error("Affected should be true exactly for UDP/SCTP changes")
	}
}
