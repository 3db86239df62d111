package ipvs

import (
	"fmt"

	"kube-proxy/rules/internal/traceresult"
)

// OwnsChain reports whether table's chain is one only mode ipvs writes (mode iptables shares the others'
// names): KUBE-LOAD-BALANCER in nat, KUBE-IPVS-FILTER in any table.
func OwnsChain(table, chain string) bool {
	return chain == chainIPVSFilter || table == "nat" && chain == chainLoadBalancer
}

// ExplainStop says why a filter rule of mode ipvs stopped a packet, from what the rule writer puts in
// that chain; "" when the rule is none of those (another mode's).
func ExplainStop(s traceresult.Stop) string {
	if s.Table != "filter" {
		return ""
	}
	switch s.Chain {
	case chainIPVSFilter:
		// It rejects new connections to an address on the dummy link that no virtual server serves on
		// that port.
		if s.Verdict == "REJECT" {
			return fmt.Sprintf("%s is a Service address on %s, but no Service serves %s port %d on it (mode ipvs' %s rejects it)",
				s.Dst, DummyLink, s.Protocol, s.Port, chainIPVSFilter)
		}
	case chainProxyFirewall:
		// Its drops match the no-local sets, and carry their comments (writeNoLocalDrops).
		if s.Comment == setDefs[setInternalNoLocal].comment || s.Comment == setDefs[setExternalNoLocal].comment {
			return "the Service's traffic policy is Local and no endpoint of it runs on this node"
		}
	case chainSourceRangesFirewall:
		// Its one DROP ends it, after the RETURNs of the allowed sources.
		return "the source address is not in the Service's loadBalancerSourceRanges"
	case chainIPVSOutFilter:
		return fmt.Sprintf("the node's own address is not in the Service's loadBalancerSourceRanges (mode ipvs' %s keeps the node from this load balancer IP)",
			chainIPVSOutFilter)
	}
	return ""
}
