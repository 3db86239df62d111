package ipvs

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// renderCase is one golden renderer case: a snapshot, a configuration and the node's addresses.
type renderCase struct {
	name  string
	cfg   Config
	addrs []string // the node's addresses (not on kube-ipvs0)
	snap  *proxy.Snapshot
}

func renderCases() []renderCase {
	n := node("192.168.0.10", "10.244.1.0/24")
	cfg := testConfig(v4)
	addrs := []string{"192.168.0.10", "10.244.1.1", "127.0.0.1"}
	web := func(opts ...func(*proxy.ServicePort)) *proxy.ServicePort {
		return svc("default/web", "http", v1.ProtocolTCP, "10.96.0.10", 80,
			append([]func(*proxy.ServicePort){eps("10.244.1.5:8080,local", "10.244.2.6:8080")}, opts...)...)
	}
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	// fromConfig is ConfigFrom's IPv4 Config for the default configuration of mode ipvs with the cluster CIDR
	// of testConfig, changed by edit.
	fromConfig := func(edit func(*config.KubeProxyConfiguration)) Config {
		kp := config.Default()
		kp.Mode, kp.ClusterCIDR = config.ModeIPVS, "10.244.0.0/16"
		edit(kp)
		c, err := ConfigFrom(kp, v4)
		if err != nil {
			panic(err)
		}
		return c
	}
	return []renderCase{
		{name: "clusterip", cfg: cfg, addrs: addrs, snap: snapshot(v4, n, web(),
			svc("kube-system/dns", "dns", v1.ProtocolUDP, "10.96.0.53", 53, eps("10.244.2.7:53", "10.244.3.8:53")),
			svc("kube-system/dns", "dns-tcp", v1.ProtocolTCP, "10.96.0.53", 53, eps("10.244.2.7:53", "10.244.3.8:53")))},
		{name: "no-endpoints", cfg: cfg, addrs: addrs, snap: snapshot(v4, n,
			svc("default/empty", "", v1.ProtocolTCP, "10.96.0.11", 80, nodePort(30011)))},
		{name: "nodeport", cfg: cfg, addrs: addrs, snap: snapshot(v4, n, web(nodePort(30080)),
			svc("default/udp", "", v1.ProtocolUDP, "10.96.0.12", 5000, nodePort(30500), eps("10.244.2.6:5000")),
			svc("default/sctp", "", v1.ProtocolSCTP, "10.96.0.13", 7000, nodePort(30700), eps("10.244.2.6:7000")))},
		{name: "nodeport-addresses", cfg: with(cfg, func(c *Config) {
			c.NodePortAddresses = proxy.ParseNodePortAddresses([]string{"192.168.0.0/16", "localhost"}, v4)
		}), addrs: []string{"192.168.0.10", "192.168.1.10", "10.244.1.1", "127.0.0.1"}, snap: snapshot(v4, n, web(nodePort(30080)))},
		{name: "nodeport-primary", cfg: with(cfg, func(c *Config) {
			c.NodePortAddresses = proxy.ParseNodePortAddresses([]string{"primary"}, v4)
		}), addrs: []string{"192.168.0.10", "192.168.1.10", "10.244.1.1"}, snap: snapshot(v4, n, web(nodePort(30080)))},
		{name: "externalips", cfg: cfg, addrs: addrs, snap: snapshot(v4, n,
			web(externalIPs("203.0.113.7", "192.168.0.10")),
			svc("default/ext-local", "", v1.ProtocolTCP, "10.96.0.14", 443, externalIPs("203.0.113.8"), etpLocal(0),
				eps("10.244.1.5:8443,local", "10.244.2.6:8443")))},
		{name: "loadbalancer", cfg: cfg, addrs: addrs, snap: snapshot(v4, n,
			web(nodePort(30080), lbIPs("198.51.100.20")),
			svc("default/lb-fw", "", v1.ProtocolTCP, "10.96.0.15", 443, nodePort(30443), lbIPs("198.51.100.21"),
				sourceRanges("203.0.113.0/24", "192.168.0.0/16"), eps("10.244.2.6:8443")),
			svc("default/lb-fw-nonode", "", v1.ProtocolTCP, "10.96.0.16", 443, nodePort(30444), lbIPs("198.51.100.22"),
				sourceRanges("203.0.113.0/24"), eps("10.244.2.6:8443")))},
		{name: "etp-local", cfg: cfg, addrs: addrs, snap: snapshot(v4, n,
			web(nodePort(30080), lbIPs("198.51.100.20"), etpLocal(32000)))},
		{name: "etp-local-no-local-endpoints", cfg: cfg, addrs: addrs, snap: snapshot(v4, n,
			svc("default/remote", "", v1.ProtocolTCP, "10.96.0.17", 80, nodePort(30081), lbIPs("198.51.100.23"),
				externalIPs("203.0.113.9"), etpLocal(32001), eps("10.244.2.6:8080", "10.244.3.7:8080")))},
		{name: "itp-local", cfg: cfg, addrs: addrs, snap: snapshot(v4, n, web(itpLocal),
			svc("default/itp-remote", "", v1.ProtocolTCP, "10.96.0.18", 80, itpLocal, eps("10.244.2.6:8080")))},
		{name: "affinity", cfg: cfg, addrs: addrs, snap: snapshot(v4, n, web(affinity(10800), nodePort(30080)))},
		{name: "terminating", cfg: cfg, addrs: addrs, snap: snapshot(v4, n,
			svc("default/rolling", "", v1.ProtocolTCP, "10.96.0.19", 80,
				eps("10.244.1.5:8080,local,terminating,notready", "10.244.2.6:8080", "10.244.2.7:8080,notready")),
			svc("default/all-terminating", "", v1.ProtocolTCP, "10.96.0.20", 80,
				eps("10.244.1.5:8080,local,terminating,notready", "10.244.2.6:8080,terminating,notready",
					"10.244.2.7:8080,terminating,notready,notserving")))},
		{name: "scheduler-mh", cfg: with(cfg, func(c *Config) { c.Scheduler = "mh" }), addrs: addrs,
			snap: snapshot(v4, n, web(affinity(60)))},
		{name: "masquerade-all", cfg: with(cfg, func(c *Config) { c.MasqueradeAll = true; c.MasqueradeBit = 10 }),
			addrs: addrs, snap: snapshot(v4, n, web())},
		{name: "masquerade-bit-0", cfg: fromConfig(func(kp *config.KubeProxyConfiguration) { kp.IPTables.MasqueradeBit = ptr(int32(0)) }),
			addrs: addrs, snap: snapshot(v4, n, web(nodePort(30080)))},
		// A bindAddress that is not the Node's first IP is the primary IP: "primary" NodePorts answer on it,
		// and source ranges holding it (not the Node's first IP) let the node reach the load balancer.
		{name: "bind-address", cfg: fromConfig(func(kp *config.KubeProxyConfiguration) {
			kp.BindAddress, kp.NodePortAddresses = "192.168.1.10", []string{"primary"}
		}), addrs: []string{"192.168.0.10", "192.168.1.10", "10.244.1.1"}, snap: snapshot(v4, n,
			svc("default/lb-bind", "", v1.ProtocolTCP, "10.96.0.15", 443, nodePort(30443), lbIPs("198.51.100.21"),
				sourceRanges("192.168.1.0/24"), eps("10.244.2.6:8443")),
			svc("default/lb-node", "", v1.ProtocolTCP, "10.96.0.16", 443, nodePort(30444), lbIPs("198.51.100.22"),
				sourceRanges("192.168.0.0/24"), eps("10.244.2.6:8443")))},
		{name: "detect-local-none", cfg: with(cfg, func(c *Config) { c.LocalDetector = proxy.LocalDetector{} }),
			addrs: addrs, snap: snapshot(v4, n, web())},
		{name: "detect-local-nodecidr", cfg: with(cfg, func(c *Config) { c.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeNodeCIDR} }),
			addrs: addrs, snap: snapshot(v4, n, web(nodePort(30080), etpLocal(0), lbIPs("198.51.100.20")),
				svc("default/remote", "", v1.ProtocolTCP, "10.96.0.17", 80, nodePort(30081), etpLocal(0), eps("10.244.2.6:8080")))},
		{name: "detect-local-bridge", cfg: with(cfg, func(c *Config) {
			c.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeBridgeInterface, Interface: "cbr0"}
		}),
			addrs: addrs, snap: snapshot(v4, n, web())},
		{name: "detect-local-ifprefix", cfg: with(cfg, func(c *Config) {
			c.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeInterfaceNamePrefix, Interface: "veth"}
		}),
			addrs: addrs, snap: snapshot(v4, n, web())},
		{name: "conflict", cfg: cfg, addrs: addrs, snap: snapshot(v4, n, web(externalIPs("203.0.113.7")),
			svc("default/also", "", v1.ProtocolTCP, "10.96.0.21", 80, externalIPs("203.0.113.7"), eps("10.244.3.3:80")))},
		{name: "ipv6", cfg: testConfig(v6), addrs: []string{"fd00::10", "fe80::1", "::1", "192.168.0.10"},
			snap: snapshot(v6, node("fd00::10", "fd00:10:244:1::/64"),
				svc("default/web", "http", v1.ProtocolTCP, "fd00:96::10", 80, nodePort(30080), lbIPs("2001:db8::20"),
					sourceRanges("2001:db8:1::/48", "10.0.0.0/8"), eps("[fd00:10:244:1::5]:8080,local", "[fd00:10:244:2::6]:8080")),
				svc("default/sctp", "", v1.ProtocolSCTP, "fd00:96::13", 7000, nodePort(30700), etpLocal(0), eps("[fd00:10:244:2::6]:7000")))},
	}
}

// renderCaseText renders a case with a fresh dataplane and writes the desired state and the iptables payload.
func renderCaseText(c renderCase) string {
	var addrs []netip.Addr
	for _, a := range c.addrs {
		addrs = append(addrs, netip.MustParseAddr(a))
	}
	d := &Dataplane{cfg: c.cfg}
	d.en = newEnv(&d.cfg, &c.snap.Node, addrs)
	want := d.render(c.snap)
	rules := renderRules(&d.cfg, &ruleInputs{nonEmpty: want.nonEmpty(), noNodeAccess: want.sortedNoNodeAccess(), node: &c.snap.Node})
	return stateOf(&d.cfg, want).String() + "# iptables-restore\n" + string(rules)
}

func TestRenderGolden(t *testing.T) {
	for _, c := range renderCases() {
		t.Run(c.name, func(t *testing.T) {
			got := renderCaseText(c)
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("reading golden file (run with -update to create it): %v", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("desired state differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestRenderSemantics checks the decisions the golden files encode, so that -update cannot bless a wrong one.
func TestRenderSemantics(t *testing.T) {
	rendered := map[string]*desired{}
	cfgs := map[string]Config{}
	for _, c := range renderCases() {
		var addrs []netip.Addr
		for _, a := range c.addrs {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		d := &Dataplane{cfg: c.cfg}
		d.en = newEnv(&d.cfg, &c.snap.Node, addrs)
		rendered[c.name], cfgs[c.name] = d.render(c.snap), c.cfg
	}
	realsOf := func(name, k string, proto protocol) string {
		v := rendered[name].vs(key(proto, k))
		if v == nil {
			return "<no virtual server>"
		}
		var s []string
		for _, r := range v.reals {
			s = append(s, r.String())
		}
		return strings.Join(s, " ")
	}
	has := func(name string, id setID, e string) bool {
		for en := range rendered[name].sets[id] {
			if en.String() == e {
				return true
			}
		}
		return false
	}
	markOf := func(c Config) string { return c.mark() }
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"cluster IP uses Cluster endpoints", realsOf("clusterip", "10.96.0.10:80", protoTCP), "10.244.1.5:8080 10.244.2.6:8080"},
		{"UDP and TCP on one port are two virtual servers", realsOf("clusterip", "10.96.0.53:53", protoUDP), "10.244.2.7:53 10.244.3.8:53"},
		{"no endpoints: virtual server without real servers", realsOf("no-endpoints", "10.96.0.11:80", protoTCP), ""},
		{"node port on every node address but loopback", realsOf("nodeport", "10.244.1.1:30080", protoTCP), "10.244.1.5:8080 10.244.2.6:8080"},
		{"no node port on loopback", realsOf("nodeport", "127.0.0.1:30080", protoTCP), "<no virtual server>"},
		{"localhost in nodePortAddresses serves nothing", realsOf("nodeport-addresses", "127.0.0.1:30080", protoTCP), "<no virtual server>"},
		{"nodePortAddresses excludes other addresses", realsOf("nodeport-addresses", "10.244.1.1:30080", protoTCP), "<no virtual server>"},
		{"nodePortAddresses primary", realsOf("nodeport-primary", "192.168.1.10:30080", protoTCP), "<no virtual server>"},
		{"SCTP node ports are per address", has("nodeport", setNodePortSCTP, "192.168.0.10,sctp:30700"), true},
		{"external IP on a node address is not bound", rendered["externalips"].binds[netip.MustParseAddr("192.168.0.10")], 0},
		{"external IP bound", rendered["externalips"].binds[netip.MustParseAddr("203.0.113.7")], 1},
		{"etp Local uses local endpoints", realsOf("etp-local", "198.51.100.20:80", protoTCP), "10.244.1.5:8080"},
		{"etp Local keeps Cluster endpoints for cluster IP", realsOf("etp-local", "10.96.0.10:80", protoTCP), "10.244.1.5:8080 10.244.2.6:8080"},
		{"etp Local node port uses local endpoints", realsOf("etp-local", "192.168.0.10:30080", protoTCP), "10.244.1.5:8080"},
		{"etp Local without local endpoints keeps Cluster endpoints", realsOf("etp-local-no-local-endpoints", "198.51.100.23:80", protoTCP), "10.244.2.6:8080 10.244.3.7:8080"},
		{"etp Local without local endpoints drops from outside", has("etp-local-no-local-endpoints", setExternalNoLocal, "192.168.0.10,tcp:30081"), true},
		{"itp Local uses local endpoints", realsOf("itp-local", "10.96.0.10:80", protoTCP), "10.244.1.5:8080"},
		{"itp Local without local endpoints: none", realsOf("itp-local", "10.96.0.18:80", protoTCP), ""},
		{"itp Local without local endpoints drops", has("itp-local", setInternalNoLocal, "10.96.0.18,tcp:80"), true},
		{"terminating endpoint not used while others are ready", realsOf("terminating", "10.96.0.19:80", protoTCP), "10.244.2.6:8080"},
		{"serving terminating endpoints used when none is ready", realsOf("terminating", "10.96.0.20:80", protoTCP), "10.244.1.5:8080 10.244.2.6:8080"},
		{"affinity is persistence", rendered["affinity"].vs(key(protoTCP, "10.96.0.10:80")).timeout, uint32(10800)},
		{"mh gets mh-port", rendered["scheduler-mh"].vs(key(protoTCP, "10.96.0.10:80")).flags, uint32(flagPersistent | flagSched2)},
		{"conflict: first by name wins", realsOf("conflict", "203.0.113.7:80", protoTCP), "10.244.3.3:80"},
		{"hairpin entry for local endpoints", has("clusterip", setLoopBack, "10.244.1.5,tcp:8080,10.244.1.5"), true},
		{"source range containing the node", has("loadbalancer", setLoadBalancerSourceIP, "198.51.100.21,tcp:443,198.51.100.21"), true},
		{"masqueradeBit 0 is mark 0x1", markOf(cfgs["masquerade-bit-0"]), "0x00000001"},
		{"bindAddress: primary NodePorts on it", realsOf("bind-address", "192.168.1.10:30443", protoTCP), "10.244.2.6:8443"},
		{"bindAddress: not on the Node's first IP", realsOf("bind-address", "192.168.0.10:30443", protoTCP), "<no virtual server>"},
		{"bindAddress: source range containing it", has("bind-address", setLoadBalancerSourceIP, "198.51.100.21,tcp:443,198.51.100.21"), true},
		{"bindAddress: source range with the Node's first IP only", rendered["bind-address"].noNodeAccess[ipPortEntry(netip.MustParseAddr("198.51.100.22"), protoTCP, 443)], 1},
		{"source range without the node", rendered["loadbalancer"].noNodeAccess[ipPortEntry(netip.MustParseAddr("198.51.100.22"), protoTCP, 443)], 1},
		{"IPv6 ignores IPv4 source ranges", len(rendered["ipv6"].sets[setLoadBalancerSourceCIDR]), 1},
		{"IPv6 node ports skip link-local", realsOf("ipv6", "[fe80::1]:30080", protoTCP), "<no virtual server>"},
		{"IPv6 node port", realsOf("ipv6", "[fd00::10]:30080", protoTCP), "[fd00:10:244:1::5]:8080 [fd00:10:244:2::6]:8080"},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestSetNames(t *testing.T) {
	for id := setID(0); id < numSets; id++ {
		for _, f := range []v1.IPFamily{v4, v6} {
			if n := setName(id, f); len(n) > maxSetName {
				t.Errorf("set name %q is longer than %d", n, maxSetName)
			}
		}
	}
	if got, want := setName(setLoadBalancerSourceCIDR, v6), "KUBE-6-LOAD-BALANCER-SOURCE-CID"; got != want {
		t.Errorf("IPv6 name = %q, want upstream's truncation %q", got, want)
	}
	if got, want := setName(setClusterIP, v6), "KUBE-6-CLUSTER-IP"; got != want {
		t.Errorf("IPv6 name = %q, want %q", got, want)
	}
}

// TestEntryEncoding: the compact form of set members gives back the addresses and networks it was made
// from, prints as the ipset tool does, and orders addresses as netip does.
func TestEntryEncoding(t *testing.T) {
	addrs := []string{"10.0.0.1", "10.0.0.2", "192.0.2.255", "0.0.0.0", "::", "fd00::1", "fd00::2", "::ffff:10.0.0.1", "2001:db8::ff"}
	for _, a := range addrs {
		ip := netip.MustParseAddr(a)
		if got := ipOf(ip).addr(); got != ip {
			t.Errorf("ipOf(%s).addr() = %s", ip, got)
		}
		for _, b := range addrs {
			o := netip.MustParseAddr(b)
			if got, want := ipOf(ip).Compare(ipOf(o)), ip.Compare(o); got != want {
				t.Errorf("compare %s %s = %d, netip says %d", ip, o, got, want)
			}
		}
	}
	if ipOf(netip.Addr{}).IsValid() || ipOf(netip.Addr{}).Compare(ipOf(netip.MustParseAddr("0.0.0.0"))) >= 0 {
		t.Error("an invalid address is valid or does not sort first")
	}
	base := ipPortEntry(netip.MustParseAddr("10.0.0.1"), protoTCP, 80)
	for _, tc := range []struct {
		e    entry
		want string
	}{
		{entry{port: 30080}, "30080"},
		{entry{ip: ipOf(netip.MustParseAddr("10.0.0.1"))}, "10.0.0.1"},
		{base, "10.0.0.1,tcp:80"},
		{base.withIP2(netip.MustParseAddr("10.0.0.9")), "10.0.0.1,tcp:80,10.0.0.9"},
		{base.withNet(netip.MustParsePrefix("192.168.0.0/16")), "10.0.0.1,tcp:80,192.168.0.0/16"},
		{ipPortEntry(netip.MustParseAddr("fd00::1"), protoUDP, 53).withNet(netip.MustParsePrefix("fd00::/8")), "fd00::1,udp:53,fd00::/8"},
	} {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
	n := base.withNet(netip.MustParsePrefix("10.1.0.0/16"))
	if n.net() != netip.MustParsePrefix("10.1.0.0/16") || n.ip2().IsValid() {
		t.Errorf("net entry: net %v ip2 %v", n.net(), n.ip2())
	}
	a := base.withIP2(netip.MustParseAddr("10.1.0.0"))
	if a.ip2() != netip.MustParseAddr("10.1.0.0") || a.net().IsValid() || a == n || a.compare(n) >= 0 || n.compare(a) <= 0 {
		t.Errorf("address entry: ip2 %v net %v; an address and a network of the same bytes must differ", a.ip2(), a.net())
	}
}
