package proxy

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
)

func TestSettingsFor(t *testing.T) {
	bit := func(b int32) *int32 { return &b }
	node := &Node{IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	cases := []struct {
		name   string
		edit   func(c *config.KubeProxyConfiguration)
		family v1.IPFamily
		check  func(t *testing.T, s Settings)
	}{
		{"iptables defaults", nil, v1.IPv4Protocol, func(t *testing.T, s Settings) {
			if s.MasqueradeMark() != 0x4000 || s.MasqueradeAll || !s.LocalhostNodePorts {
				t.Errorf("got %+v", s)
			}
			if cidrs, all := s.NodePortCIDRs(node); !all || cidrs != nil {
				t.Errorf("NodePortCIDRs = %v, %v; want all", cidrs, all)
			}
		}},
		{"masqueradeBit 0 is mark 1 in every mode", func(c *config.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = bit(0) },
			v1.IPv4Protocol, func(t *testing.T, s Settings) {
				if s.MasqueradeMark() != 1 {
					t.Errorf("mark = %#x, want 0x1", s.MasqueradeMark())
				}
			}},
		{"nftables takes its own section and defaults to primary", func(c *config.KubeProxyConfiguration) {
			c.Mode = config.ModeNFTables
			c.IPTables.MasqueradeBit, c.NFTables.MasqueradeBit = bit(3), bit(20)
			c.NFTables.MasqueradeAll = true
		}, v1.IPv4Protocol, func(t *testing.T, s Settings) {
			if s.MasqueradeMark() != 1<<20 || !s.MasqueradeAll {
				t.Errorf("got bit %d all %v", s.MasqueradeBit, s.MasqueradeAll)
			}
			cidrs, all := s.NodePortCIDRs(node)
			if diff := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}, cidrs, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" || all {
				t.Errorf("NodePortCIDRs (-want +got): %s all=%v", diff, all)
			}
		}},
		{"bindAddress is the primary IP of its family", func(c *config.KubeProxyConfiguration) {
			c.BindAddress = "10.0.0.9"
			c.NodePortAddresses = []string{"primary"}
		}, v1.IPv4Protocol, func(t *testing.T, s Settings) {
			if got := s.NodeIP(node); got != netip.MustParseAddr("10.0.0.9") {
				t.Errorf("NodeIP = %v", got)
			}
			if cidrs, _ := s.NodePortCIDRs(node); len(cidrs) != 1 || cidrs[0] != netip.MustParsePrefix("10.0.0.9/32") {
				t.Errorf("NodePortCIDRs = %v", cidrs)
			}
		}},
		{"bindAddress of the other family is not ours", func(c *config.KubeProxyConfiguration) { c.BindAddress = "fd00::9" },
			v1.IPv4Protocol, func(t *testing.T, s Settings) {
				if s.BindAddress.IsValid() || s.NodeIP(node) != netip.MustParseAddr("10.0.0.1") {
					t.Errorf("got %v / %v", s.BindAddress, s.NodeIP(node))
				}
			}},
		{"cluster CIDR of the family", func(c *config.KubeProxyConfiguration) { c.ClusterCIDR = "fd00:10:244::/48, 10.244.0.0/16" },
			v1.IPv4Protocol, func(t *testing.T, s Settings) {
				if m := s.LocalDetector.For(v1.IPv4Protocol, node); m.CIDR != netip.MustParsePrefix("10.244.0.0/16") || !m.Implemented() {
					t.Errorf("local match %+v", m)
				}
			}},
		{"no cluster CIDR detects nothing", nil, v1.IPv4Protocol, func(t *testing.T, s Settings) {
			if m := s.LocalDetector.For(v1.IPv4Protocol, node); m.Implemented() {
				t.Errorf("local match %+v", m)
			}
		}},
		{"NodeCIDR from the node", func(c *config.KubeProxyConfiguration) { c.DetectLocalMode = config.LocalModeNodeCIDR },
			v1.IPv6Protocol, func(t *testing.T, s Settings) {
				if m := s.LocalDetector.For(v1.IPv6Protocol, node); m.CIDR != netip.MustParsePrefix("fd00:10:244:1::/64") {
					t.Errorf("local match %+v", m)
				}
			}},
		{"interface name prefix", func(c *config.KubeProxyConfiguration) {
			c.DetectLocalMode, c.DetectLocal.InterfaceNamePrefix = config.LocalModeInterfaceNamePrefix, "veth"
		}, v1.IPv4Protocol, func(t *testing.T, s Settings) {
			if m := s.LocalDetector.For(v1.IPv4Protocol, node); m.Interface != "veth" || !m.Prefix {
				t.Errorf("local match %+v", m)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			if tc.edit != nil {
				tc.edit(c)
			}
			s, err := SettingsFor(c, tc.family)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

func TestFamilies(t *testing.T) {
	c := config.Default()
	if f := Families(c); f[0] != v1.IPv4Protocol {
		t.Errorf("default: %v", f)
	}
	c.BindAddress = "fd00::1"
	if f := Families(c); f[0] != v1.IPv6Protocol {
		t.Errorf("IPv6 bindAddress: %v", f)
	}
}
