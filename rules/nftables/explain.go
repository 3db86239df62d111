package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/internal/traceresult"
	"kube-proxy/rules/nftables/nftrace"
)

// perServicePrefixes are the prefixes of the chains and sets made for one Service port (or one of its
// endpoints).
var perServicePrefixes = []string{prefixService, prefixLocal, prefixExternal, prefixFirewall, prefixEndpoint, prefixAffinity}

// ServiceOfName returns the Service port ("ns/name" or "ns/name:port") a per-Service chain's or set's
// name carries (prefix, hash, "-ns/name/protocol/port", see serviceBase; an endpoint's chain and affinity
// set go on with "__ip/port", see endpointBase); "" for any other name.
func ServiceOfName(name string) string {
	for _, prefix := range perServicePrefixes {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		_, base, ok := strings.Cut(rest, "-")
		if !ok || strings.Count(base, "/") < 3 {
			return ""
		}
		parts := strings.SplitN(base, "/", 4)
		port, _, _ := strings.Cut(parts[3], "__")
		if port == "" {
			return parts[0] + "/" + parts[1]
		}
		return parts[0] + "/" + parts[1] + ":" + port
	}
	return ""
}

// AffinityHit reports whether rule (as nft lists it) is a session affinity check of a Service's chain:
// a match of the source address in an endpoint's affinity set, which holds the clients sent there before.
func AffinityHit(rule string) bool { return strings.Contains(rule, "saddr @"+prefixAffinity) }

// ExplainStop says why a rule of mode nftables' table stopped a packet, from what the renderer writes in
// that chain; "" for a chain it writes no drop or reject in.
func ExplainStop(s traceresult.Stop) string {
	switch {
	case s.Chain == chainReject:
		// Reached from the no-endpoint maps, for a Service port without any endpoint.
		return "the Service has no ready endpoints"
	case (s.Chain == chainServiceEndpointsCheck || s.Chain == chainNodePortEndpointsCheck) && s.Verdict == "DROP":
		// The no-endpoint maps' drop verdict: endpoints, but none the traffic policy lets this node use.
		return "the Service's traffic policy is Local and no endpoint of it runs on this node"
	case s.Chain == chainClusterIPsCheck && s.Verdict == "DROP":
		return fmt.Sprintf("%s is inside the cluster's ServiceCIDRs but no Service has it", s.Dst)
	case s.Chain == chainClusterIPsCheck:
		return fmt.Sprintf("%s is a ClusterIP, but no Service serves %s port %d on it", s.Dst, s.Protocol, s.Port)
	case strings.HasPrefix(s.Chain, prefixFirewall):
		return "the source address is not in the Service's loadBalancerSourceRanges"
	case slices.ContainsFunc(localhostProtocols, func(p v1.Protocol) bool { return s.Chain == localhostRejectChain(p) }):
		return "NodePorts are not served on localhost by this configuration"
	}
	return ""
}

// ServiceElement is an element of the service-ips map: a Service port's address, protocol and port, the
// chain its new connections go to, and the Service port that chain is made for.
type ServiceElement struct {
	Addr     netip.Addr
	Protocol string
	Port     uint16
	Chain    string
	// Service is the Service port (ServiceOfName of Chain); ClusterIP is set when Addr is its cluster IP
	// (the chain is the port's service- or local- chain, not its external- or firewall- chain).
	Service   string
	ClusterIP bool
}

// ServiceElements reads the service-ips map of family's table in ts (the live table or a rendered one),
// in the map's order.
func ServiceElements(ts *nftrace.Tables, family v1.IPFamily) []ServiceElement {
	var out []ServiceElement
	for _, e := range ts.Elements(familyOf(family).name, mapServiceIPs) {
		// Canonical form: `ADDR . PROTO . PORT [comment "..."] : goto CHAIN`.
		key, value, _ := strings.Cut(e, " : ")
		fields := strings.Split(strings.SplitN(key, " comment ", 2)[0], " . ")
		chain, ok := strings.CutPrefix(value, "goto ")
		if len(fields) != 3 || !ok {
			continue
		}
		addr, err := netip.ParseAddr(fields[0])
		port, err2 := strconv.ParseUint(fields[2], 10, 16)
		if err != nil || err2 != nil {
			continue
		}
		out = append(out, ServiceElement{Addr: addr, Protocol: fields[1], Port: uint16(port), Chain: chain,
			Service:   ServiceOfName(chain),
			ClusterIP: strings.HasPrefix(chain, prefixService) || strings.HasPrefix(chain, prefixLocal)})
	}
	return out
}
