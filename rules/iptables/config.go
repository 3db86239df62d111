package iptables

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

// Config is everything besides the snapshot that changes the rules. ConfigFrom builds it from the
// configuration file; one Renderer serves one Config and one IP family.
type Config struct {
	// Settings are the per-family settings every mode shares (proxy.SettingsFor): the family rendered,
	// masqueradeAll and the masquerade bit, local-traffic detection, the NodePort addresses, the node's
	// primary IP and localhostNodePorts. LocalhostNodePorts lets NodePorts answer on 127.0.0.0/8 (IPv4
	// only, and only when the NodePort addresses include loopback, as upstream); it needs the
	// route_localnet sysctl, which the Dataplane sets before it first writes such rules.
	proxy.Settings
	// TCPBeLiberal is set when nf_conntrack_tcp_be_liberal is on: no DROP rule for ctstate INVALID.
	TCPBeLiberal bool
	// NFAcct says which of upstream's nfacct counters exist on the node; the rules count packets in
	// those, as upstream's do. The Dataplane creates them on full syncs (ConfigFrom leaves this empty).
	NFAcct NFAcct
	// ChunkLines, when positive, splits a render whose own-chain rules exceed twice this many into
	// transactions of about this many rules (Result.Chunks). The writer sets it for iptables-nft, whose
	// restore time grows faster than the payload; iptables-legacy rewrites whole tables per call and is
	// best given one.
	ChunkLines int
}

// NFAcct names the nfacct counters the rules may count packets in, as upstream's rules do when the
// kernel has them.
type NFAcct struct {
	// InvalidDropped: KUBE-FORWARD's DROP of ctstate INVALID packets counts them in CounterInvalidDropped.
	InvalidDropped bool
	// LocalhostNodePorts: while NodePorts answer on 127.0.0.0/8, each NodePort's KUBE-NODEPORTS rule has
	// a copy for 127.0.0.0/8 ahead of it that counts its packets in CounterLocalhostNodePorts.
	LocalhostNodePorts bool
}

// countsLocalhostNodePorts reports whether NodePorts get their counted copy for 127.0.0.0/8: the counter
// exists and localhost NodePorts are configured for IPv4. Whether a node's NodePorts answer on loopback
// is LocalhostNodePortsActive.
func (c *Config) countsLocalhostNodePorts() bool {
	return c.NFAcct.LocalhostNodePorts && c.LocalhostNodePorts && c.Family == v1.IPv4Protocol
}

// LocalhostNodePortsActive reports whether NodePorts answer on 127.0.0.0/8 for this configuration and node:
// LocalhostNodePorts is set, the family is IPv4 and the NodePort addresses include IPv4 loopback. When it is
// true the route_localnet sysctl must be 1 (upstream sets it at start-up; the Dataplane, before it writes
// the rules).
func (c *Config) LocalhostNodePortsActive(node *proxy.Node) bool {
	if !c.LocalhostNodePorts || c.Family != v1.IPv4Protocol {
		return false
	}
	npa := c.nodePortAddrs(node)
	return npa.all || npa.v4Loopback
}

// nodePortAddrs is the NodePort address selection of one family.
type nodePortAddrs struct {
	all        bool           // every local address
	prefixes   []netip.Prefix // else: local addresses within these
	primary    netip.Addr     // and this address (the node's primary IP), if valid
	v4Loopback bool           // the selection contains 127.0.0.1
}

// nodePortAddrs resolves the NodePort addresses for node (Settings.NodePortCIDRs) and keeps apart the
// primary IP that "primary" selects: it gets a rule of its own, "-d nodeIP", as upstream's.
func (c *Config) nodePortAddrs(node *proxy.Node) nodePortAddrs {
	v4 := c.Family == v1.IPv4Protocol
	cidrs, all := c.NodePortCIDRs(node)
	if all {
		return nodePortAddrs{all: true, v4Loopback: v4}
	}
	var n nodePortAddrs
	if ip := c.NodeIP(node); c.NodePortAddresses.Primary && ip.IsValid() && !ip.IsLoopback() {
		if i := slices.Index(cidrs, netip.PrefixFrom(ip, ip.BitLen())); i >= 0 {
			n.primary, cidrs = ip, slices.Delete(cidrs, i, i+1)
		}
	}
	for _, p := range cidrs {
		p = p.Masked()
		if p.Addr().IsLoopback() || p.Contains(netip.AddrFrom4([4]byte{127, 0, 0, 0})) {
			n.v4Loopback = n.v4Loopback || v4
		}
		n.prefixes = append(n.prefixes, p)
	}
	return n
}

// jump is a JumpRule written as a row of JumpRules' table.
func jump(table, chain, target string, args []string, comment string) xtables.JumpRule {
	return xtables.JumpRule{Table: table, Chain: chain, Target: target, Args: args, Comment: comment}
}

// JumpRules returns the jump rules from built-in chains that upstream ensures on every full sync, kubelet's
// KUBE-FIREWALL jumps last. They do not depend on cfg today; it is taken so that they may.
func JumpRules(cfg Config) []xtables.JumpRule {
	_ = cfg
	ctNew := []string{"-m", "conntrack", "--ctstate", "NEW"}
	const (
		external = "kubernetes externally-visible service portals"
		portals  = "kubernetes service portals"
		lbfw     = "kubernetes load balancer firewall"
	)
	return []xtables.JumpRule{
		jump("filter", "INPUT", chainExternalServices, ctNew, external),
		jump("filter", "FORWARD", chainExternalServices, ctNew, external),
		jump("filter", "INPUT", chainNodePorts, nil, "kubernetes health check service ports"),
		jump("filter", "FORWARD", chainServices, ctNew, portals),
		jump("filter", "OUTPUT", chainServices, ctNew, portals),
		jump("filter", "FORWARD", chainForward, nil, "kubernetes forwarding rules"),
		jump("filter", "INPUT", chainProxyFirewall, ctNew, lbfw),
		jump("filter", "OUTPUT", chainProxyFirewall, ctNew, lbfw),
		jump("filter", "FORWARD", chainProxyFirewall, ctNew, lbfw),
		jump("nat", "OUTPUT", chainServices, nil, portals),
		jump("nat", "PREROUTING", chainServices, nil, portals),
		jump("nat", "POSTROUTING", chainPostrouting, nil, "kubernetes postrouting rules"),
		jump("filter", "INPUT", chainKubeletFirewall, nil, ""),
		jump("filter", "OUTPUT", chainKubeletFirewall, nil, ""),
	}
}

// CanaryChains returns the empty KUBE-PROXY-CANARY chains upstream creates in the mangle, nat and filter
// tables and polls: when one disappears, someone flushed the tables and a full sync must restore our rules.
func CanaryChains() []struct{ Table, Chain string } {
	return []struct{ Table, Chain string }{
		{"mangle", chainCanary},
		{"nat", chainCanary},
		{"filter", chainCanary},
	}
}
