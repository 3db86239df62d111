package userspace

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules/internal/traceresult"
)

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
		if got := ExplainStop(traceresult.Stop{Table: tt.table, Chain: tt.chain, Verdict: tt.verdict}); got != tt.want {
			t.Errorf("ExplainStop(%s, %s, %s) = %q, want %q", tt.table, tt.chain, tt.verdict, got, tt.want)
		}
	}
}

// TestRedirectsToProxy: the portal and NodePort chains' rules redirect to the proxy; the filter's do not.
func TestRedirectsToProxy(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, proxy.Node{Name: proxytest.NodeName, Known: true},
		proxytest.Port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.NodePort(30080), proxytest.Endpoints("10.244.1.2:8080")),
		proxytest.Port("ns/none", "http", v1.ProtocolTCP, "10.96.0.11", 80))
	_, payload := render(testConfig(t, nil), snap)
	redirects := 0
	for _, r := range rulesOf(payload) {
		filter := strings.HasPrefix(r, "-A "+ChainFilter+" ")
		if !filter {
			redirects++
		}
		if RedirectsToProxy(r) == filter {
			t.Errorf("RedirectsToProxy(%s) = %v", r, filter)
		}
	}
	if redirects < 2 {
		t.Errorf("%d redirects, want the ClusterIP's and the NodePort's:\n%s", redirects, payload)
	}
}
