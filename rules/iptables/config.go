package iptables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// Detect-local modes (LocalDetector.Mode), named as in the kube-proxy configuration.
const (
	DetectLocalNone                = ""
	DetectLocalClusterCIDR         = "ClusterCIDR"
	DetectLocalNodeCIDR            = "NodeCIDR"
	DetectLocalBridgeInterface     = "BridgeInterface"
	DetectLocalInterfaceNamePrefix = "InterfaceNamePrefix"
)

// Config is everything besides the snapshot that changes the rules. main builds it from the configuration
// file; one Renderer serves one Config and one IP family.
type Config struct {
	// Family is the IP family of the snapshots rendered (IPv4 or IPv6).
	Family v1.IPFamily
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit (0-31, validated by config) that marks packets for SNAT. 0 is taken as
	// upstream's default, 14 (mark 0x4000), so bit 0 itself cannot be chosen.
	MasqueradeBit int
	// LocalDetector says how traffic from a local pod is recognised; the zero value detects nothing.
	LocalDetector LocalDetector
	// NodePortAddresses limits NodePorts to local addresses within these prefixes (only those of Family
	// count). Empty, or containing a zero-length prefix, means all local addresses.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary is set when nodePortAddresses contained "primary": NodePorts also answer on the node's
	// primary IP of Family (snap.Node.IPs[0]).
	NodePortPrimary bool
	// LocalhostNodePorts lets NodePorts answer on 127.0.0.0/8 (IPv4 only, and only when the NodePort
	// addresses include loopback, as upstream). It needs the route_localnet sysctl, which main sets.
	LocalhostNodePorts bool
	// TCPBeLiberal is set when nf_conntrack_tcp_be_liberal is on: no DROP rule for ctstate INVALID.
	TCPBeLiberal bool
	// ChunkLines, when positive, splits a render whose own-chain rules exceed twice this many into
	// transactions of about this many rules (Result.Chunks). The writer sets it for iptables-nft, whose
	// restore time grows faster than the payload; iptables-legacy rewrites whole tables per call and is
	// best given one.
	ChunkLines int
}

// LocalDetector says how "traffic from a local pod" is matched.
type LocalDetector struct {
	// Mode is one of the DetectLocal* constants.
	Mode string
	// CIDRs are the cluster CIDRs for ClusterCIDR mode (the first one of the family is used). NodeCIDR mode
	// ignores them and reads the node's pod CIDRs from the snapshot.
	CIDRs []netip.Prefix
	// Interface is the bridge name (BridgeInterface) or the interface name prefix (InterfaceNamePrefix).
	Interface string
}

// args returns the iptables arguments matching traffic from a local pod, and their negation; nil when
// the detector is not implemented for this family and node.
func (d *LocalDetector) args(family v1.IPFamily, node *proxy.Node) (ifLocal, ifNotLocal []string) {
	cidr := func(list []netip.Prefix) ([]string, []string) {
		for _, p := range list {
			if familyOf(p.Addr()) == family {
				s := p.String()
				return []string{"-s", s}, []string{"!", "-s", s}
			}
		}
		return nil, nil
	}
	switch d.Mode {
	case DetectLocalClusterCIDR:
		return cidr(d.CIDRs)
	case DetectLocalNodeCIDR:
		return cidr(node.PodCIDRs)
	case DetectLocalBridgeInterface:
		if d.Interface != "" {
			return []string{"-i", d.Interface}, []string{"!", "-i", d.Interface}
		}
	case DetectLocalInterfaceNamePrefix:
		if d.Interface != "" {
			return []string{"-i", d.Interface + "+"}, []string{"!", "-i", d.Interface + "+"}
		}
	}
	return nil, nil
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// LocalhostNodePortsActive reports whether NodePorts answer on 127.0.0.0/8 for this configuration and node:
// LocalhostNodePorts is set, the family is IPv4 and the NodePort addresses include IPv4 loopback. When it is
// true the route_localnet sysctl must be 1 (upstream sets it at start-up).
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

func (c *Config) nodePortAddrs(node *proxy.Node) nodePortAddrs {
	var n nodePortAddrs
	for _, p := range c.NodePortAddresses {
		if familyOf(p.Addr()) != c.Family {
			continue
		}
		p = p.Masked()
		if p.Bits() == 0 {
			return nodePortAddrs{all: true, v4Loopback: c.Family == v1.IPv4Protocol}
		}
		if p.Addr().IsLoopback() || p.Contains(netip.AddrFrom4([4]byte{127, 0, 0, 0})) {
			n.v4Loopback = n.v4Loopback || c.Family == v1.IPv4Protocol
		}
		n.prefixes = append(n.prefixes, p)
	}
	if c.NodePortPrimary && len(node.IPs) > 0 && !node.IPs[0].IsLoopback() && familyOf(node.IPs[0]) == c.Family {
		n.primary = node.IPs[0]
	}
	if len(n.prefixes) == 0 && !n.primary.IsValid() {
		// As upstream: no address of this family selected means all of them.
		return nodePortAddrs{all: true, v4Loopback: c.Family == v1.IPv4Protocol}
	}
	return n
}

// JumpRule is a rule in a built-in chain that sends traffic into one of our chains. Upstream ensures each
// with `iptables -C` and, when missing, `iptables -I` (prepend) in the order JumpRules returns them, after
// creating Target if needed. The rule is Args, then `-m comment --comment Comment` when Comment is not empty,
// then `-j Target`.
type JumpRule struct {
	Table   string
	Chain   string // the built-in chain holding the rule
	Target  string // our chain
	Args    []string
	Comment string
}

// RuleSpec returns the rule's arguments as given to iptables after the chain name.
func (j JumpRule) RuleSpec() []string {
	spec := append([]string(nil), j.Args...)
	if j.Comment != "" {
		spec = append(spec, "-m", "comment", "--comment", j.Comment)
	}
	return append(spec, "-j", j.Target)
}

// JumpRules returns the jump rules from built-in chains that upstream ensures on every full sync, kubelet's
// KUBE-FIREWALL jumps last. They do not depend on cfg today; it is taken so that they may.
func JumpRules(cfg Config) []JumpRule {
	_ = cfg
	ctNew := []string{"-m", "conntrack", "--ctstate", "NEW"}
	const (
		external = "kubernetes externally-visible service portals"
		portals  = "kubernetes service portals"
		lbfw     = "kubernetes load balancer firewall"
	)
	return []JumpRule{
		{"filter", "INPUT", chainExternalServices, ctNew, external},
		{"filter", "FORWARD", chainExternalServices, ctNew, external},
		{"filter", "INPUT", chainNodePorts, nil, "kubernetes health check service ports"},
		{"filter", "FORWARD", chainServices, ctNew, portals},
		{"filter", "OUTPUT", chainServices, ctNew, portals},
		{"filter", "FORWARD", chainForward, nil, "kubernetes forwarding rules"},
		{"filter", "INPUT", chainProxyFirewall, ctNew, lbfw},
		{"filter", "OUTPUT", chainProxyFirewall, ctNew, lbfw},
		{"filter", "FORWARD", chainProxyFirewall, ctNew, lbfw},
		{"nat", "OUTPUT", chainServices, nil, portals},
		{"nat", "PREROUTING", chainServices, nil, portals},
		{"nat", "POSTROUTING", chainPostrouting, nil, "kubernetes postrouting rules"},
		{"filter", "INPUT", chainKubeletFirewall, nil, ""},
		{"filter", "OUTPUT", chainKubeletFirewall, nil, ""},
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
