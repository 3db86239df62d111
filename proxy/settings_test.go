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

// TestNodePortIPs: of the node's addresses, those inside nodePortAddresses ("primary" following the
// Node), sorted and each once; every address, unread, when nothing restricts the family.
func TestNodePortIPs(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	node := &Node{IPs: addrs("10.0.0.1")}
	local := addrs("192.168.1.5", "10.0.0.1", "127.0.0.1", "10.0.0.1", "192.168.2.5", "fd00::1")
	for _, tt := range []struct {
		list []string
		want []netip.Addr
		all  bool
	}{
		{nil, nil, true},
		{[]string{"0.0.0.0/0"}, nil, true},
		{[]string{"primary"}, addrs("10.0.0.1"), false},
		{[]string{"primary", "192.168.0.0/16"}, addrs("10.0.0.1", "192.168.1.5", "192.168.2.5"), false},
		{[]string{"localhost"}, addrs("127.0.0.1"), false},
		{[]string{"172.16.0.0/12"}, nil, false},
	} {
		s := Settings{Family: v1.IPv4Protocol, NodePortAddresses: ParseNodePortAddresses(tt.list, v1.IPv4Protocol)}
		read := false
		got, all, err := s.NodePortIPs(node, func() ([]netip.Addr, error) { read = true; return local, nil })
		if !cmp.Equal(got, tt.want, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })) || all != tt.all || read == all || err != nil {
			t.Errorf("%q: %v, all %v (addresses read: %v), want %v, all %v", tt.list, got, all, read, tt.want, tt.all)
		}
	}
}
