package ipvs

import (
	"fmt"
	"net/netip"
)

// OwnsChain reports whether table's chain is one only mode ipvs writes (mode iptables shares the others'
// names): KUBE-LOAD-BALANCER in nat, KUBE-IPVS-FILTER in any table.
func OwnsChain(table, chain string) bool {
	return chain == chainIPVSFilter || table == "nat" && chain == chainLoadBalancer
}

// ExplainStop says why a packet to dst (protocol, port) that ended with verdict in table's chain was
// stopped there, when that is mode ipvs' KUBE-IPVS-FILTER rejecting it; "" otherwise. The filter rejects
// new connections to an address on the dummy link that no IPVS virtual server serves on that port.
func ExplainStop(table, chain, verdict string, dst netip.Addr, protocol string, port uint16) string {
	if table != "filter" || chain != chainIPVSFilter || verdict != "REJECT" {
		return ""
	}
	return fmt.Sprintf("%s is a Service address on %s, but no Service serves %s port %d on it (mode ipvs' %s rejects it)",
		dst, DummyLink, protocol, port, chainIPVSFilter)
}
