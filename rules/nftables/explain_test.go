package nftables

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
)

func TestServiceOfChain(t *testing.T) {
	named := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	unnamed := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "dns"}, Protocol: v1.ProtocolUDP}
	ep := netip.MustParseAddrPort("10.244.1.2:8080")
	for chain, want := range map[string]string{
		prefixService + serviceBase(named):       "ns/web:http",
		prefixExternal + serviceBase(named):      "ns/web:http",
		prefixService + serviceBase(unnamed):     "ns/dns",
		prefixEndpoint + endpointBase(named, ep): "ns/web:http__10.244.1.2/8080",
		prefixLocal + serviceBase(named):         "",
		prefixFirewall + serviceBase(named):      "",
		chainServiceEndpointsCheck:               "",
		"nodeports":                              "",
	} {
		if got := ServiceOfChain(chain); got != want {
			t.Errorf("ServiceOfChain(%s) = %q, want %q", chain, got, want)
		}
	}
}
