package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
)

// Settings are the configuration facts every dataplane needs for one IP family, derived once from the
// configuration file by SettingsFor so that the modes cannot disagree: how traffic from local pods is
// recognised, which mark asks for masquerading, which addresses NodePorts answer on, and what the node's
// primary IP is. Each dataplane renders them in its own syntax.
type Settings struct {
	// Family is the IP family these settings are for.
	Family v1.IPFamily
	// MasqueradeAll masquerades all traffic to cluster IPs (nftables.masqueradeAll in mode nftables,
	// iptables.masqueradeAll otherwise, as upstream).
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit, 0 to 31, that asks for SNAT (nftables.masqueradeBit in mode
	// nftables, iptables.masqueradeBit otherwise).
	MasqueradeBit int
	// LocalDetector says how traffic from a local pod is recognised.
	LocalDetector LocalDetector
	// NodePortAddresses are the addresses NodePorts answer on, keywords resolved. In mode nftables an
	// empty nodePortAddresses means "primary" (config applies upstream's platform default).
	NodePortAddresses NodePortAddresses
	// BindAddress is bindAddress when it names an address of Family: then it is the node's primary IP of
	// that family, as upstream decides it (for "primary" NodePorts and the loadBalancerSourceRanges node
	// check). It is invalid otherwise.
	BindAddress netip.Addr
	// LocalhostNodePorts is iptables.localhostNodePorts (mode iptables serves NodePorts on 127.0.0.1).
	LocalhostNodePorts bool
}

// SettingsFor derives the settings of one IP family from a validated configuration.
func SettingsFor(c *config.KubeProxyConfiguration, family v1.IPFamily) (Settings, error) {
	all, bit, err := c.Masquerade()
	if err != nil {
		return Settings{}, err
	}
	s := Settings{
		Family:            family,
		MasqueradeAll:     all,
		MasqueradeBit:     bit,
		NodePortAddresses: ParseNodePortAddresses(c.EffectiveNodePortAddresses(), family),
	}
	if c.IPTables.LocalhostNodePorts != nil {
		s.LocalhostNodePorts = *c.IPTables.LocalhostNodePorts
	}
	if a, err := netip.ParseAddr(c.BindAddress); err == nil && !a.IsUnspecified() && ipFamily(a.Unmap()) == family {
		s.BindAddress = a.Unmap()
	}
	d, err := localDetectorFor(c, family)
	if err != nil {
		return Settings{}, err
	}
	s.LocalDetector = d
	return s, nil
}

// Families returns the IP families in the order to program them: the family of bindAddress first when it
// names an address (as upstream decides its primary family), IPv4 otherwise.
func Families(c *config.KubeProxyConfiguration) []v1.IPFamily {
	if a, err := netip.ParseAddr(c.BindAddress); err == nil && !a.IsUnspecified() && ipFamily(a.Unmap()) == v1.IPv6Protocol {
		return []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}
	}
	return []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
}

// MasqueradeMark is the mark value of MasqueradeBit (0x4000 for bit 14).
func (s *Settings) MasqueradeMark() uint32 { return 1 << uint(s.MasqueradeBit) }

// NodeIP is the node's primary IP of the family: bindAddress when it names one, else the Node's first
// address of the family (InternalIP first). It is invalid when neither is known.
func (s *Settings) NodeIP(node *Node) netip.Addr {
	if s.BindAddress.IsValid() {
		return s.BindAddress
	}
	if len(node.IPs) > 0 {
		return node.IPs[0]
	}
	return netip.Addr{}
}

// NodePortCIDRs returns the CIDRs NodePorts answer on for this node, "primary" resolved to NodeIP;
// matchAll is true when nothing restricts the family.
func (s *Settings) NodePortCIDRs(node *Node) (cidrs []netip.Prefix, matchAll bool) {
	return s.NodePortAddresses.forIP(s.NodeIP(node))
}

// NodePortIPs returns the node's addresses that NodePorts (and health-check node ports) answer on, of
// those addrs returns (InterfaceAddrs for the node's own), sorted, each once; matchAll is set instead
// when nothing restricts the family (see NodePortCIDRs), and addrs is then not called. addrs' error is
// returned: no addresses is not what the node has.
func (s *Settings) NodePortIPs(node *Node, addrs func() ([]netip.Addr, error)) (ips []netip.Addr, matchAll bool, err error) {
	cidrs, all := s.NodePortCIDRs(node)
	if all {
		return nil, true, nil
	}
	local, err := addrs()
	if err != nil {
		return nil, false, err
	}
	for _, a := range local {
		if slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(a) }) {
			ips = append(ips, a)
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return slices.Compact(ips), false, nil
}

// LocalDetector says how "traffic from a local pod" is recognised, as configured (detectLocalMode and
// its fields) for one family. For NodeCIDR the CIDR comes from the Node: see For.
type LocalDetector struct {
	// Mode is the configured detectLocalMode; LocalModeClusterCIDR without a cluster CIDR of the family
	// detects nothing.
	Mode config.LocalMode
	// CIDR is the cluster CIDR of the family (ClusterCIDR mode).
	CIDR netip.Prefix
	// Interface is the bridge name (BridgeInterface) or the interface name prefix (InterfaceNamePrefix).
	Interface string
}

// LocalMatch is a LocalDetector resolved for a node: what the rules match on. Exactly one of CIDR and
// Interface is set, or neither when local traffic cannot be detected.
type LocalMatch struct {
	// CIDR matches the source address.
	CIDR netip.Prefix
	// Interface matches the interface the packet arrived on; Prefix makes it a name prefix.
	Interface string
	Prefix    bool
}

// Implemented reports whether local traffic can be told apart (upstream's IsImplemented).
func (m LocalMatch) Implemented() bool { return m.CIDR.IsValid() || m.Interface != "" }

// For resolves the detector for a node: NodeCIDR takes the Node's first pod CIDR of the family.
func (d LocalDetector) For(family v1.IPFamily, node *Node) LocalMatch {
	switch d.Mode {
	case config.LocalModeClusterCIDR:
		return LocalMatch{CIDR: d.CIDR}
	case config.LocalModeNodeCIDR:
		for _, p := range node.PodCIDRs {
			if ipFamily(p.Addr()) == family {
				return LocalMatch{CIDR: p.Masked()}
			}
		}
	case config.LocalModeBridgeInterface:
		return LocalMatch{Interface: d.Interface}
	case config.LocalModeInterfaceNamePrefix:
		return LocalMatch{Interface: d.Interface, Prefix: d.Interface != ""}
	}
	return LocalMatch{}
}

func localDetectorFor(c *config.KubeProxyConfiguration, family v1.IPFamily) (LocalDetector, error) {
	switch c.DetectLocalMode {
	case "", config.LocalModeClusterCIDR:
		d := LocalDetector{Mode: config.LocalModeClusterCIDR}
		for _, s := range strings.Split(c.ClusterCIDR, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return LocalDetector{}, fmt.Errorf("clusterCIDR %q: %w", s, err)
			}
			if ipFamily(p.Addr()) == family && !d.CIDR.IsValid() {
				d.CIDR = p.Masked()
			}
		}
		return d, nil
	case config.LocalModeNodeCIDR:
		return LocalDetector{Mode: config.LocalModeNodeCIDR}, nil
	case config.LocalModeBridgeInterface:
		return LocalDetector{Mode: config.LocalModeBridgeInterface, Interface: c.DetectLocal.BridgeInterface}, nil
	case config.LocalModeInterfaceNamePrefix:
		return LocalDetector{Mode: config.LocalModeInterfaceNamePrefix, Interface: c.DetectLocal.InterfaceNamePrefix}, nil
	}
	return LocalDetector{}, fmt.Errorf("detectLocalMode %q is not supported", c.DetectLocalMode)
}
