package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules/internal/traceresult"
	"kube-proxy/rules/nftables/nftrace"
)

func TestServiceOfName(t *testing.T) {
	named := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	unnamed := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "dns"}, Protocol: v1.ProtocolUDP}
	ep := netip.MustParseAddrPort("10.244.1.2:8080")
	for chain, want := range map[string]string{
		prefixService + serviceBase(named):         "ns/web:http",
		prefixExternal + serviceBase(named):        "ns/web:http",
		prefixService + serviceBase(unnamed):       "ns/dns",
		prefixEndpoint + endpointBase(named, ep):   "ns/web:http",
		prefixEndpoint + endpointBase(unnamed, ep): "ns/dns",
		prefixAffinity + endpointBase(named, ep):   "ns/web:http",
		prefixLocal + serviceBase(named):           "ns/web:http",
		prefixFirewall + serviceBase(unnamed):      "ns/dns",
		chainServiceEndpointsCheck:                 "",
		"nodeports":                                "",
	} {
		if got := ServiceOfName(chain); got != want {
			t.Errorf("ServiceOfName(%s) = %q, want %q", chain, got, want)
		}
	}
}

// TestAffinityHit: of a Service's rules with session affinity, the service chain's matches of the
// endpoints' affinity sets are affinity hits, and the endpoint chains' updates of them are not.
func TestAffinityHit(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, proxy.Node{Name: proxytest.NodeName, Known: true},
		proxytest.Port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.Affinity(10800),
			proxytest.Endpoints("10.244.1.2:8080", "10.244.1.3:8080")))
	text, err := Desired(testConfig(v1.IPv4Protocol, "10.244.0.0/16"), snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	hits, updates := 0, 0
	for _, line := range strings.Split(text, "\n") {
		if !strings.Contains(line, "@"+prefixAffinity) {
			if AffinityHit(line) {
				t.Errorf("AffinityHit(%s) without an affinity set", line)
			}
			continue
		}
		if strings.Contains(line, "update @") {
			updates++
			if AffinityHit(line) {
				t.Errorf("AffinityHit(%s) = true for recording the client", line)
			}
		} else if strings.Contains(line, "goto "+prefixEndpoint) {
			hits++
			if !AffinityHit(line) {
				t.Errorf("AffinityHit(%s) = false", line)
			}
		}
	}
	if hits != 2 || updates != 2 {
		t.Errorf("%d affinity checks and %d updates, want 2 and 2:\n%s", hits, updates, text)
	}
}

// TestExplainStop: each chain the renderer drops or rejects in is explained; the others are not.
func TestExplainStop(t *testing.T) {
	stop := func(chain, verdict string) traceresult.Stop {
		return traceresult.Stop{Chain: chain, Verdict: verdict, Dst: netip.MustParseAddr("10.96.0.10"), Protocol: "tcp", Port: 81}
	}
	named := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	for _, tt := range []struct {
		s    traceresult.Stop
		want string
	}{
		{stop(chainReject, "REJECT"), "the Service has no ready endpoints"},
		{stop(chainServiceEndpointsCheck, "DROP"), "the Service's traffic policy is Local and no endpoint of it runs on this node"},
		{stop(chainNodePortEndpointsCheck, "DROP"), "the Service's traffic policy is Local and no endpoint of it runs on this node"},
		{stop(chainClusterIPsCheck, "DROP"), "10.96.0.10 is inside the cluster's ServiceCIDRs but no Service has it"},
		{stop(chainClusterIPsCheck, "REJECT"), "10.96.0.10 is a ClusterIP, but no Service serves tcp port 81 on it"},
		{stop(prefixFirewall+serviceBase(named), "DROP"), "the source address is not in the Service's loadBalancerSourceRanges"},
		{stop(localhostRejectChain(v1.ProtocolUDP), "REJECT"), "NodePorts are not served on localhost by this configuration"},
		{stop(chainFilterForward, "DROP"), ""},
		{stop(prefixService+serviceBase(named), "DROP"), ""},
	} {
		if got := ExplainStop(tt.s); got != tt.want {
			t.Errorf("ExplainStop(%s, %s) = %q, want %q", tt.s.Chain, tt.s.Verdict, got, tt.want)
		}
	}
}

// TestServiceElements: the service-ips map of a rendered table, read back through the tracer's model:
// cluster IPs go to the port's service- (or local-) chain, external addresses to its external- chain.
func TestServiceElements(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, proxy.Node{Name: proxytest.NodeName, Known: true},
		proxytest.Port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.ExternalIPs("192.0.2.10"),
			proxytest.Endpoints("10.244.1.2:8080")),
		proxytest.Port("ns/dns", "", v1.ProtocolUDP, "10.96.0.53", 53, proxytest.InternalLocal, proxytest.Endpoints("10.244.1.3:53,local")))
	text, err := Desired(testConfig(v1.IPv4Protocol, "10.244.0.0/16"), snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := nftrace.New()
	if err := ts.Load(text); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ServiceElements(ts, v1.IPv4Protocol) {
		got = append(got, fmt.Sprintf("%s %s:%d %s cluster=%v %s", e.Protocol, e.Addr, e.Port, e.Service, e.ClusterIP, e.Chain[:strings.Index(e.Chain, "-")]))
	}
	want := []string{"udp 10.96.0.53:53 ns/dns cluster=true local", "tcp 10.96.0.10:80 ns/web:http cluster=true service",
		"tcp 192.0.2.10:80 ns/web:http cluster=false external"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("elements:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if ServiceElements(ts, v1.IPv6Protocol) != nil {
		t.Errorf("elements in a family without a table")
	}
}
