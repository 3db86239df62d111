package userspace

import (
	"strings"

	"kube-proxy/rules/internal/traceresult"
)

// OwnsChain reports whether chain is one of mode userspace's capture chains: a portal chain (any
// KUBE-PORTALS- chain, which upstream's userspace mode also wrote) or a NodePort chain.
func OwnsChain(chain string) bool {
	return strings.HasPrefix(chain, portalsPrefix) || chain == ChainNodePortContainer || chain == ChainNodePortHost
}

// ExplainStop says why a packet was stopped (DROP or REJECT) by a rule of mode userspace's filter; ""
// for any other chain. The filter rejects a Service port without ready endpoints and drops what a Local
// traffic policy or loadBalancerSourceRanges refuse.
func ExplainStop(s traceresult.Stop) string {
	if s.Table != "filter" || s.Chain != ChainFilter {
		return ""
	}
	if s.Verdict == "REJECT" {
		return "the Service has no ready endpoints (mode userspace rejects it before it reaches the proxy)"
	}
	return "mode userspace drops it: the Service's traffic policy is Local and no endpoint of it runs on this node, or the source is not in its loadBalancerSourceRanges"
}

// RedirectsToProxy reports whether rule (as iptables-save prints it) redirects the packet to the node
// itself: the portal and NodePort chains' REDIRECT to the proxy's listener.
func RedirectsToProxy(rule string) bool { return strings.Contains(rule, "-j REDIRECT") }
