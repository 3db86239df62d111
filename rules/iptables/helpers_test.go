package iptables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
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

// testConfig returns a Config of family with the masquerade bit SettingsFor defaults to (14), the local
// detector d and both nfacct counters present, as on a kernel with nfacct; nothing else is set: NodePorts
// answer on every address, not on localhost.
func testConfig(family v1.IPFamily, d proxy.LocalDetector) Config {
	return Config{Settings: proxy.Settings{Family: family, MasqueradeBit: config.DefaultMasqueradeBit, LocalDetector: d},
		NFAcct: allCounters}
}

// allCounters are the nfacct counters a kernel with nfacct has once the Dataplane created them.
var allCounters = NFAcct{InvalidDropped: true, LocalhostNodePorts: true}

// configFrom returns what ConfigFrom derives for IPv4 from the default configuration with clusterCIDR
// 10.244.0.0/16, changed by edit, with both nfacct counters present.
func configFrom(edit func(*config.KubeProxyConfiguration)) Config {
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16"
	edit(c)
	cfg, err := ConfigFrom(c, v1.IPv4Protocol)
	if err != nil {
		panic(err)
	}
	cfg.NFAcct = allCounters
	return cfg
}

// with returns c changed by f.
func with(c Config, f func(*Config)) Config { f(&c); return c }

// clusterCIDR detects local traffic by its source in cidr (detectLocalMode ClusterCIDR).
func clusterCIDR(cidr string) proxy.LocalDetector {
	return proxy.LocalDetector{Mode: config.LocalModeClusterCIDR, CIDR: netip.MustParsePrefix(cidr)}
}

// npAddrs is what ParseNodePortAddresses keeps of a nodePortAddresses list for family.
func npAddrs(family v1.IPFamily, list ...string) proxy.NodePortAddresses {
	return proxy.ParseNodePortAddresses(list, family)
}

type netipAddr = netip.Addr

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
