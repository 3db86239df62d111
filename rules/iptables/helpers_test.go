package iptables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
)

const testNode = proxytest.NodeName

// The builders of hand-made snapshots, shared with the IPVS tests.
var (
	port         = proxytest.Port
	eps          = proxytest.Endpoints
	nodePort     = proxytest.NodePort
	externalIPs  = proxytest.ExternalIPs
	lbIPs        = proxytest.LoadBalancerIPs
	sourceRanges = proxytest.SourceRanges
	affinity     = proxytest.Affinity
	etpLocal     = proxytest.ExternalLocal
	itpLocal     = proxytest.InternalLocal
	snapshot     = proxytest.Snapshot
	derive       = proxytest.Derive
)

func v4Node(ips ...string) proxy.Node {
	n := proxy.Node{Name: testNode, Known: true}
	for _, s := range ips {
		n.IPs = append(n.IPs, netip.MustParseAddr(s))
	}
	return n
}

func prefixes(list ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range list {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// seed000 is the seed 000 case.
func seed000() *proxy.Snapshot {
	return snapshot(v1.IPv4Protocol, v4Node("10.0.0.1"),
		port("default/clusterip-service", "", v1.ProtocolTCP, "10.100.100.100", 80,
			eps("192.168.11.73:80", "192.168.11.74:80", "192.168.221.10:80")))
}

type netipAddr = netip.Addr

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
