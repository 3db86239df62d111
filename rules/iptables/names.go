package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"kube-proxy/proxy"
)

// Chain name prefixes of the per-Service chains.
const (
	PrefixService         = "KUBE-SVC" // endpoints for Cluster traffic policy
	PrefixServiceLocal    = "KUBE-SVL" // endpoints for Local traffic policy
	PrefixServiceExternal = "KUBE-EXT" // external destinations (NodePort, externalIPs, load balancer IPs)
	PrefixServiceFirewall = "KUBE-FW"  // loadBalancerSourceRanges
	PrefixEndpoint        = "KUBE-SEP" // one endpoint
)

// The chains kube-proxy owns besides the per-Service ones.
const (
	chainServices         = "KUBE-SERVICES"
	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	chainNodePorts        = "KUBE-NODEPORTS"
	chainPostrouting      = "KUBE-POSTROUTING"
	chainMarkMasq         = "KUBE-MARK-MASQ"
	chainForward          = "KUBE-FORWARD"
	chainProxyFirewall    = "KUBE-PROXY-FIREWALL"
	chainCanary           = "KUBE-PROXY-CANARY"
	// chainKubeletFirewall duplicates kubelet's chain holding the localhost anti-martian rule.
	chainKubeletFirewall = "KUBE-FIREWALL"
)

// The nfacct counters upstream's rules count packets in (Config.NFAcct), which its
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total and
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total report.
const (
	CounterInvalidDropped     = "ct_state_invalid_dropped_pkts"
	CounterLocalhostNodePorts = "localhost_nps_accepted_pkts"
)

// isServiceChain reports whether a chain name is one of the per-Service chains (ours or upstream's).
func isServiceChain(name string) bool {
	for _, p := range [...]string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// hashName returns prefix + "-" + the first 16 characters of base32(sha256(parts...)), the scheme upstream
// uses so that chain names stay within iptables' 28-character limit.
func hashName(prefix string, parts ...string) string {
	var in [256]byte
	b := in[:0]
	for _, p := range parts {
		b = append(b, p...)
	}
	sum := sha256.Sum256(b)
	var out strings.Builder
	out.Grow(len(prefix) + 17)
	out.WriteString(prefix)
	out.WriteByte('-')
	// 10 bytes are exactly 16 base32 characters, without padding.
	var enc [16]byte
	base32.StdEncoding.Encode(enc[:], sum[:10])
	out.Write(enc[:])
	return out.String()
}

// protoLower returns the protocol in lower case as iptables and the chain hashes want it.
func protoLower(spn proxy.ServicePortName) string {
	switch spn.Protocol {
	case "TCP":
		return "tcp"
	case "UDP":
		return "udp"
	case "SCTP":
		return "sctp"
	}
	return strings.ToLower(string(spn.Protocol))
}

// ServiceChainName returns the name of a per-Service chain: prefix is one of KUBE-SVC, KUBE-SVL, KUBE-EXT or
// KUBE-FW, followed by the hash of the Service port name ("ns/name" or "ns/name:port") and the lower-case
// protocol, exactly as upstream names it.
func ServiceChainName(prefix string, spn proxy.ServicePortName) string {
	return hashName(prefix, spn.String(), protoLower(spn))
}

// EndpointChainName returns the KUBE-SEP chain name of one endpoint ("ip:port") of a Service port.
func EndpointChainName(spn proxy.ServicePortName, endpointAddr string) string {
	return hashName(PrefixEndpoint, spn.String(), protoLower(spn), endpointAddr)
}
