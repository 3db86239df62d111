package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// Schedulers are the IPVS schedulers ipvs.scheduler may name: those of the Linux kernel's ip_vs_* modules.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

// Detect-local modes, named as in the configuration.
const (
	detectNone         = ""
	detectClusterCIDR  = string(config.LocalModeClusterCIDR)
	detectNodeCIDR     = string(config.LocalModeNodeCIDR)
	detectBridge       = string(config.LocalModeBridgeInterface)
	detectIfNamePrefix = string(config.LocalModeInterfaceNamePrefix)
)

// Config is everything besides the snapshot and the node's addresses that the plan depends on, for one IP
// family. NewConfig derives it from the configuration file.
type Config struct {
	// Family is the IP family planned for.
	Family v1.IPFamily
	// Scheduler is the IPVS scheduler of every virtual server.
	Scheduler string
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit marking packets to masquerade (upstream's default is 14).
	MasqueradeBit int
	// DetectLocal says how traffic from local pods is recognised: one of the detect* modes, with CIDR for
	// ClusterCIDR (the cluster CIDR of Family; invalid when none is configured) and Interface for the two
	// interface modes. NodeCIDR reads the node's pod CIDRs from the snapshot.
	DetectLocal     string
	DetectLocalCIDR netip.Prefix
	Interface       string
	// NodePortAddresses selects the node addresses NodePorts answer on.
	NodePortAddresses proxy.NodePortAddresses
	// ExcludeCIDRs protect virtual servers made by others: one inside them that no Service wants is never
	// deleted.
	ExcludeCIDRs []netip.Prefix
	// StrictARP sets arp_ignore=1 and arp_announce=2 on all interfaces.
	StrictARP bool
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's connection timeouts; 0 keeps the kernel's.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
}

// NewConfig derives the IPVS configuration of one family from a validated configuration.
func NewConfig(cfg *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	c := Config{
		Family:            family,
		Scheduler:         cfg.IPVS.Scheduler,
		MasqueradeAll:     cfg.IPTables.MasqueradeAll,
		MasqueradeBit:     14,
		NodePortAddresses: proxy.ParseNodePortAddresses(cfg.NodePortAddresses, family),
		StrictARP:         cfg.IPVS.StrictARP,
		TCPTimeout:        cfg.IPVS.TCPTimeout.Duration,
		TCPFinTimeout:     cfg.IPVS.TCPFinTimeout.Duration,
		UDPTimeout:        cfg.IPVS.UDPTimeout.Duration,
	}
	if c.Scheduler == "" {
		c.Scheduler = "rr"
	}
	if !slices.Contains(Schedulers, c.Scheduler) {
		return c, fmt.Errorf("ipvs.scheduler: unknown IPVS scheduler %q; must be one of %s", c.Scheduler, strings.Join(Schedulers, ", "))
	}
	if b := cfg.IPTables.MasqueradeBit; b != nil {
		if *b < 0 || *b > 31 {
			return c, fmt.Errorf("iptables.masqueradeBit: %d is not within 0..31", *b)
		}
		c.MasqueradeBit = int(*b)
	}
	for i, s := range cfg.IPVS.ExcludeCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return c, fmt.Errorf("ipvs.excludeCIDRs[%d]: %w", i, err)
		}
		if familyOf(p.Addr()) == family {
			c.ExcludeCIDRs = append(c.ExcludeCIDRs, p.Masked())
		}
	}
	switch mode := string(cfg.DetectLocalMode); mode {
	case detectNone, detectClusterCIDR:
		for _, s := range strings.Split(cfg.ClusterCIDR, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return c, fmt.Errorf("clusterCIDR: %w", err)
			}
			if familyOf(p.Addr()) == family && !c.DetectLocalCIDR.IsValid() {
				c.DetectLocal, c.DetectLocalCIDR = detectClusterCIDR, p.Masked()
			}
		}
	case detectNodeCIDR:
		c.DetectLocal = detectNodeCIDR
	case detectBridge:
		c.DetectLocal, c.Interface = detectBridge, cfg.DetectLocal.BridgeInterface
	case detectIfNamePrefix:
		c.DetectLocal, c.Interface = detectIfNamePrefix, cfg.DetectLocal.InterfaceNamePrefix
	default:
		return c, fmt.Errorf("detectLocalMode: unknown mode %q", mode)
	}
	return c, nil
}

// excluded reports whether addr lies in one of the excluded CIDRs.
func (c *Config) excluded(addr netip.Addr) bool {
	for _, p := range c.ExcludeCIDRs {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// mark returns the masquerade mark as upstream's IPVS mode writes it ("0x004000").
func (c *Config) mark() string {
	return fmt.Sprintf("%#08x", uint32(1)<<uint(c.MasqueradeBit))
}

// localArgs returns the iptables arguments matching traffic that does NOT come from a local pod, or nil
// when local traffic cannot be detected (the mode is unset, or NodeCIDR without a pod CIDR of the family).
func (c *Config) notLocalArgs(node *proxy.Node) []string {
	switch c.DetectLocal {
	case detectClusterCIDR:
		if c.DetectLocalCIDR.IsValid() {
			return []string{"!", "-s", c.DetectLocalCIDR.String()}
		}
	case detectNodeCIDR:
		for _, p := range node.PodCIDRs {
			if familyOf(p.Addr()) == c.Family {
				return []string{"!", "-s", p.Masked().String()}
			}
		}
	case detectBridge:
		if c.Interface != "" {
			return []string{"!", "-i", c.Interface}
		}
	case detectIfNamePrefix:
		if c.Interface != "" {
			return []string{"!", "-i", c.Interface + "+"}
		}
	}
	return nil
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}
