package iptables

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// ConfigFrom derives the renderer configuration of one IP family from the (validated) configuration file.
func ConfigFrom(c *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	out := Config{
		Family:        family,
		MasqueradeAll: c.IPTables.MasqueradeAll,
		MasqueradeBit: 14,
		TCPBeLiberal:  c.Conntrack.TCPBeLiberal,
	}
	if b := c.IPTables.MasqueradeBit; b != nil {
		if *b == 0 {
			return Config{}, fmt.Errorf("iptables.masqueradeBit 0 is not supported by this kube-proxy; use another bit (default 14)")
		}
		out.MasqueradeBit = int(*b)
	}
	if c.IPTables.LocalhostNodePorts != nil {
		out.LocalhostNodePorts = *c.IPTables.LocalhostNodePorts
	}
	npa := proxy.ParseNodePortAddresses(c.NodePortAddresses, family)
	out.NodePortAddresses, out.NodePortPrimary = npa.CIDRs, npa.Primary

	switch c.DetectLocalMode {
	case "", config.LocalModeClusterCIDR:
		out.LocalDetector.Mode = DetectLocalClusterCIDR
		for _, s := range strings.Split(c.ClusterCIDR, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return Config{}, fmt.Errorf("clusterCIDR %q: %w", s, err)
			}
			out.LocalDetector.CIDRs = append(out.LocalDetector.CIDRs, p.Masked())
		}
		if len(out.LocalDetector.CIDRs) == 0 {
			out.LocalDetector.Mode = DetectLocalNone
		}
	case config.LocalModeNodeCIDR:
		out.LocalDetector.Mode = DetectLocalNodeCIDR
	case config.LocalModeBridgeInterface:
		out.LocalDetector = LocalDetector{Mode: DetectLocalBridgeInterface, Interface: c.DetectLocal.BridgeInterface}
	case config.LocalModeInterfaceNamePrefix:
		out.LocalDetector = LocalDetector{Mode: DetectLocalInterfaceNamePrefix, Interface: c.DetectLocal.InterfaceNamePrefix}
	default:
		return Config{}, fmt.Errorf("detectLocalMode %q is not supported", c.DetectLocalMode)
	}
	return out, nil
}
