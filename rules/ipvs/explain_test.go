package ipvs

import (
	"net/netip"
	"testing"
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

func TestExplainStop(t *testing.T) {
	dst := netip.MustParseAddr("10.96.0.10")
	want := "10.96.0.10 is a Service address on kube-ipvs0, but no Service serves tcp port 81 on it (mode ipvs' KUBE-IPVS-FILTER rejects it)"
	if got := ExplainStop("filter", chainIPVSFilter, "REJECT", dst, "tcp", 81); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for _, tt := range []struct{ table, chain, verdict string }{
		{"filter", chainIPVSFilter, "DROP"},
		{"nat", chainIPVSFilter, "REJECT"},
		{"filter", chainProxyFirewall, "REJECT"},
	} {
		if got := ExplainStop(tt.table, tt.chain, tt.verdict, dst, "tcp", 81); got != "" {
			t.Errorf("ExplainStop(%s, %s, %s) = %q, want none", tt.table, tt.chain, tt.verdict, got)
		}
	}
}
