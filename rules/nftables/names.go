package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	"kube-proxy/proxy"
)

// TableName is the table mode nftables owns, in the ip and the ip6 family, as upstream names it.
const TableName = "kube-proxy"

// The chains, sets and maps of the table besides the per-Service ones, named as upstream names them.
const (
	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"

	chainServices               = "services"
	chainServiceEndpointsCheck  = "service-endpoints-check"
	chainNodePortEndpointsCheck = "nodeport-endpoints-check"
	chainReject                 = "reject-chain"
	chainClusterIPsCheck        = "cluster-ips-check"
	chainFirewallCheck          = "firewall-check"
	chainMasquerading           = "masquerading"

	setClusterIPs          = "cluster-ips"
	setNodePortIPs         = "nodeport-ips"
	setHairpinConnections  = "hairpin-connections"
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapFirewallIPs         = "firewall-ips"

	// With the KubeProxyNFTablesLocalhostNodePorts gate on, NodePorts on loopback addresses are rejected
	// (and counted) through this map and a chain and counter per protocol.
	mapLocalhostNodePortReject = "localhost-nodeport-reject-ports"
)

// Prefixes of the per-Service chains and sets.
const (
	prefixService  = "service-"  // endpoints for Cluster traffic policy
	prefixLocal    = "local-"    // endpoints for Local traffic policy
	prefixExternal = "external-" // external destinations (NodePort, externalIPs, load balancer IPs)
	prefixFirewall = "firewall-" // loadBalancerSourceRanges
	prefixEndpoint = "endpoint-" // one endpoint (only with session affinity)
	prefixAffinity = "affinity-" // the clients stuck to one endpoint
)

// nameMax is the longest object name nft accepts; upstream keeps the hashed part of a name within
// nameMax minus the longest prefix.
const nameMax = 256

const baseMax = nameMax - 16

// commentMax is the longest comment nft accepts.
const commentMax = 128

// hashed returns name behind a hash of itself: "HASH8CHR-name", cut to baseMax with "..." when longer
// (never, for valid Kubernetes names). The hash keeps names unique when cut and tells apart names that
// differ in one character.
func hashed(name string) string {
	sum := sha256.Sum256([]byte(name))
	var enc [56]byte
	base32.StdEncoding.Encode(enc[:], sum[:])
	out := string(enc[:8]) + "-" + name
	if len(out) > baseMax {
		out = out[:baseMax-3] + "..."
	}
	return out
}

// serviceBase is the name part of a Service port's chains: hashed "namespace/name/protocol/port".
func serviceBase(n proxy.ServicePortName) string {
	return hashed(n.Namespace + "/" + n.Name + "/" + strings.ToLower(string(n.Protocol)) + "/" + n.Port)
}

// endpointBase is the name part of an endpoint's chain and affinity set:
// hashed "namespace/name/protocol/port__ip/port", with the colons of an IPv6 address as dots.
func endpointBase(n proxy.ServicePortName, ep netip.AddrPort) string {
	ip := ep.Addr().String()
	if ep.Addr().Is6() {
		ip = strings.ReplaceAll(ip, ":", ".")
	}
	return hashed(n.Namespace + "/" + n.Name + "/" + strings.ToLower(string(n.Protocol)) + "/" + n.Port +
		"__" + ip + "/" + itoa(int(ep.Port())))
}

// isServiceChain reports whether a chain is a per-Service one: only those contain a "/".
func isServiceChain(name string) bool { return strings.Contains(name, "/") }

// isAffinitySet reports whether a set is an endpoint's affinity set.
func isAffinitySet(name string) bool { return strings.HasPrefix(name, prefixAffinity) }

// truncComment cuts a comment to what nft accepts.
func truncComment(s string) string {
	if len(s) > commentMax {
		return s[:commentMax]
	}
	return s
}
