package ipvs

import (
	"net/netip"
	"testing"

	"kube-proxy/rules/internal/traceresult"
)

// TestOwnsChain: of the chains the mode declares, only those mode iptables never writes are its own.
func TestOwnsChain(t *testing.T) {
	own := map[tableChain]bool{{"nat", chainLoadBalancer}: true, {"filter", chainIPVSFilter}: true, {"nat", chainIPVSFilter}: true}
	for _, tc := range append(ownChains, tableChain{"nat", chainIPVSFilter}, tableChain{"filter", chainLoadBalancer}) {
		if got := OwnsChain(tc.table, tc.chain); got != own[tc] {
			t.Errorf("OwnsChain(%s, %s) = %v, want %v", tc.table, tc.chain, got, own[tc])
		}
	}
}

// TestExplainStop: the filter rules the writer stops packets with are explained, and only those.
func TestExplainStop(t *testing.T) {
	stop := func(chain, verdict, comment string) traceresult.Stop {
		return traceresult.Stop{Table: "filter", Chain: chain, Verdict: verdict, Comment: comment,
			Dst: netip.MustParseAddr("10.96.0.10"), Protocol: "tcp", Port: 81}
	}
	for _, tt := range []struct {
		s    traceresult.Stop
		want string
	}{
		{stop(chainIPVSFilter, "REJECT", ""), "10.96.0.10 is a Service address on kube-ipvs0, but no Service serves tcp port 81 on it (mode ipvs' KUBE-IPVS-FILTER rejects it)"},
		{stop(chainProxyFirewall, "DROP", setDefs[setInternalNoLocal].comment), "the Service's traffic policy is Local and no endpoint of it runs on this node"},
		{stop(chainProxyFirewall, "DROP", setDefs[setExternalNoLocal].comment), "the Service's traffic policy is Local and no endpoint of it runs on this node"},
		{stop(chainSourceRangesFirewall, "DROP", ""), "the source address is not in the Service's loadBalancerSourceRanges"},
		{stop(chainIPVSOutFilter, "DROP", ""), "the node's own address is not in the Service's loadBalancerSourceRanges (mode ipvs' KUBE-IPVS-OUT-FILTER keeps the node from this load balancer IP)"},
		{stop(chainIPVSFilter, "DROP", ""), ""},
		{stop(chainProxyFirewall, "DROP", "ns/web:http traffic not accepted by KUBE-FW-ABC"), ""}, // mode iptables'
		{stop(chainForward, "DROP", ""), ""},
		{traceresult.Stop{Table: "nat", Chain: chainIPVSFilter, Verdict: "REJECT"}, ""},
	} {
		if got := ExplainStop(tt.s); got != tt.want {
			t.Errorf("ExplainStop(%+v) = %q, want %q", tt.s, got, tt.want)
		}
	}
}
