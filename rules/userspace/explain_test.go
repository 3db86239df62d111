package userspace

import "testing"

// TestOwnsChain: every chain the mode writes is its own, upstream's portal chains too, and none of mode
// iptables' (KUBE-NODEPORTS is iptables', KUBE-NODEPORT-HOST ours).
func TestOwnsChain(t *testing.T) {
	for _, chains := range Chains() {
		for _, c := range chains {
			if !OwnsChain(c) {
				t.Errorf("OwnsChain(%s) = false for a chain the mode writes", c)
			}
		}
	}
	if !OwnsChain("KUBE-PORTALS-SOMETHING") {
		t.Errorf("a KUBE-PORTALS- chain is not the mode's")
	}
	for _, c := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-PORTALS", "KUBE-SVC-ABC", "INPUT"} {
		if OwnsChain(c) {
			t.Errorf("OwnsChain(%s) = true", c)
		}
	}
}

func TestExplainStop(t *testing.T) {
	for _, tt := range []struct{ table, chain, verdict, want string }{
		{"filter", ChainFilter, "REJECT", "the Service has no ready endpoints (mode userspace rejects it before it reaches the proxy)"},
		{"filter", ChainFilter, "DROP", "mode userspace drops it: the Service's traffic policy is Local and no endpoint of it runs on this node, or the source is not in its loadBalancerSourceRanges"},
		{"nat", ChainFilter, "DROP", ""},
		{"filter", ChainPortalsHost, "REJECT", ""},
		{"filter", "KUBE-SERVICES", "REJECT", ""},
	} {
		if got := ExplainStop(tt.table, tt.chain, tt.verdict); got != tt.want {
			t.Errorf("ExplainStop(%s, %s, %s) = %q, want %q", tt.table, tt.chain, tt.verdict, got, tt.want)
		}
	}
}
