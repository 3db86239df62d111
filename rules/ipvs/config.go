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
	"kube-proxy/rules/xtables"
)

// Schedulers are the IPVS schedulers ipvs.scheduler may name: those of the Linux kernel's ip_vs_* modules.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

// Config is everything besides the snapshot and the node's addresses that the desired state depends on, for one IP
// family. ConfigFrom derives it from the configuration file.
type Config struct {
	// Settings are the per-family settings every mode shares (proxy.SettingsFor): the family rendered for,
	// masqueradeAll and the masquerade bit, local-traffic detection, the NodePort addresses and the
	// node's primary IP.
	proxy.Settings
	// Scheduler is the IPVS scheduler of every virtual server.
	Scheduler string
	// ExcludeCIDRs protect virtual servers made by others: one inside them that no Service wants is never
	// deleted.
	ExcludeCIDRs []netip.Prefix
	// StrictARP sets arp_ignore=1 and arp_announce=2 on all interfaces.
	StrictARP bool
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's connection timeouts; 0 keeps the kernel's.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
}

// ConfigFrom derives the IPVS configuration of one family from a validated configuration.
func ConfigFrom(cfg *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	s, err := proxy.SettingsFor(cfg, family)
	if err != nil {
		return Config{}, err
	}
	c := Config{
		Settings:      s,
		Scheduler:     cfg.IPVS.Scheduler,
		StrictARP:     cfg.IPVS.StrictARP,
		TCPTimeout:    cfg.IPVS.TCPTimeout.Duration,
		TCPFinTimeout: cfg.IPVS.TCPFinTimeout.Duration,
		UDPTimeout:    cfg.IPVS.UDPTimeout.Duration,
	}
	if c.Scheduler == "" {
		c.Scheduler = "rr"
	}
	if !slices.Contains(Schedulers, c.Scheduler) {
		return c, fmt.Errorf("ipvs.scheduler: unknown IPVS scheduler %q; must be one of %s", c.Scheduler, strings.Join(Schedulers, ", "))
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

// mark returns the masquerade mark as upstream's IPVS mode writes it ("0x00004000" for bit 14).
func (c *Config) mark() string {
	return fmt.Sprintf("%#08x", c.MasqueradeMark())
}

// notLocalArgs returns the iptables arguments matching traffic that does NOT come from a local pod, or nil
// when local traffic cannot be detected (no cluster CIDR of the family, NodeCIDR without a pod CIDR of
// the family, or no interface name).
func (c *Config) notLocalArgs(node *proxy.Node) []string {
	_, notLocal := xtables.LocalArgs(c.LocalDetector.For(c.Family, node))
	return notLocal
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}
