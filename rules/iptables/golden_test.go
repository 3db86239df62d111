package iptables

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/iptables/iptrace"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// step is one Render call of a golden case.
type step struct {
	snap     *proxy.Snapshot
	full     bool
	existing map[string][]string
}

// goldenCase renders its steps in order with one renderer (each partial step's prev is the previous step's
// snapshot); the golden file holds the last payload and a summary of its Result as "#" lines, which
// iptables-restore ignores.
type goldenCase struct {
	name  string
	cfg   Config
	steps []step
}

func full(s *proxy.Snapshot) step    { return step{snap: s, full: true} }
func partial(s *proxy.Snapshot) step { return step{snap: s} }

var v4 = v1.IPv4Protocol
var v6 = v1.IPv6Protocol

func goldenCases() []goldenCase {
	node := v4Node("10.0.0.1")
	nodeWithCIDR := node
	nodeWithCIDR.PodCIDRs = prefixes("10.244.1.0/24")
	cfg := testConfig(v4, clusterCIDR("10.244.0.0/16"))
	noDetect := testConfig(v4, proxy.LocalDetector{})

	npSvc := func() *proxy.ServicePort {
		return port("default/np", "http", v1.ProtocolTCP, "10.96.0.20", 80, nodePort(30080),
			eps("10.244.1.5:8080,local", "10.244.2.6:8080"))
	}
	// A LoadBalancer with externalTrafficPolicy Local, to show the detect-local modes.
	lbLocal := func() *proxy.ServicePort {
		return port("default/lb-local", "", v1.ProtocolTCP, "10.96.0.40", 443, nodePort(30443), lbIPs("203.0.113.10"),
			etpLocal(31000), eps("10.244.1.5:8443,local", "10.244.2.6:8443"))
	}
	base := seed000()
	epChanged := derive(base, nil, port("default/clusterip-service", "", v1.ProtocolTCP, "10.100.100.100", 80,
		eps("192.168.11.73:80", "192.168.221.10:80", "192.168.221.11:80")))
	twoSvcs := snapshot(v4, node, seed000().Services[base.Sorted()[0].Name], npSvc())
	oneLeft := derive(twoSvcs, []proxy.ServicePortName{npSvc().Name})

	var many []string
	for i := range 1001 {
		many = append(many, fmt.Sprintf("10.%d.%d.%d:8080", 200+i/65536, (i/256)%256, i%256))
	}

	return []goldenCase{
		{"clusterip", noDetect, []step{full(seed000())}},
		{"nodeport", cfg, []step{full(snapshot(v4, node, npSvc()))}},
		{"nodeport-localhost", with(cfg, func(c *Config) { c.LocalhostNodePorts = true }),
			[]step{full(snapshot(v4, node, npSvc()))}},
		{"nodeport-cidrs", with(cfg, func(c *Config) {
			c.NodePortAddresses = npAddrs(v4, "10.0.0.0/8", "192.168.5.7/32", "127.0.0.0/8", "2001:db8::/32")
		}),
			[]step{full(snapshot(v4, node, npSvc()))}},
		{"nodeport-cidrs-localhost", with(cfg, func(c *Config) {
			c.LocalhostNodePorts, c.NodePortAddresses = true, npAddrs(v4, "10.0.0.0/8", "127.0.0.0/8")
		}),
			[]step{full(snapshot(v4, node, npSvc()))}},
		{"nodeport-wide-cidr", with(cfg, func(c *Config) { c.NodePortAddresses = npAddrs(v4, "0.0.0.0/1") }),
			[]step{full(snapshot(v4, node, npSvc()))}},
		{"nodeport-primary", with(cfg, func(c *Config) { c.NodePortAddresses, c.LocalhostNodePorts = npAddrs(v4, "primary"), true }),
			[]step{full(snapshot(v4, node, npSvc()))}},
		// A kernel without nfacct: upstream's rules then name no counters and leave out the localhost copies.
		{"nodeport-localhost-no-nfacct", with(cfg, func(c *Config) { c.LocalhostNodePorts, c.NFAcct = true, NFAcct{} }),
			[]step{full(snapshot(v4, node, npSvc()))}},
		// nodePortAddresses "primary" while the Node has no IP matches every address, 127.0.0.1 included: the
		// counted localhost copies follow the node in a partial render.
		{"nodeport-localhost-primary-unknown", with(cfg, func(c *Config) {
			c.NodePortAddresses, c.LocalhostNodePorts = npAddrs(v4, "primary"), true
		}), []step{full(snapshot(v4, node, npSvc())), partial(snapshot(v4, proxy.Node{Name: testNode, Known: true}, npSvc()))}},
		{"externalips", cfg, []step{full(snapshot(v4, node,
			port("default/ext", "", v1.ProtocolTCP, "10.96.0.30", 80, externalIPs("192.0.2.10", "192.0.2.11"),
				eps("10.244.2.6:80", "10.244.3.7:80"))))}},
		{"loadbalancer-source-ranges", cfg, []step{full(snapshot(v4, node,
			port("default/lb", "https", v1.ProtocolTCP, "10.96.0.50", 443, nodePort(30444),
				lbIPs("203.0.113.20", "203.0.113.21"), sourceRanges("198.51.100.0/24", "10.0.0.0/24"),
				eps("10.244.2.6:8443"))))}},
		{"affinity", cfg, []step{full(snapshot(v4, node,
			port("default/sticky", "", v1.ProtocolTCP, "10.96.0.60", 80, affinity(10800), nodePort(30060),
				eps("10.244.2.6:80", "10.244.3.7:80"))))}},
		{"etp-local", cfg, []step{full(snapshot(v4, node, lbLocal()))}},
		{"etp-local-no-local-endpoints", cfg, []step{full(snapshot(v4, node,
			port("default/lb-local", "", v1.ProtocolTCP, "10.96.0.40", 443, nodePort(30443), lbIPs("203.0.113.10"),
				externalIPs("192.0.2.40"), etpLocal(31000), eps("10.244.2.6:8443"))))}},
		{"itp-local", cfg, []step{full(snapshot(v4, node,
			port("default/itp", "", v1.ProtocolUDP, "10.96.0.70", 53, itpLocal, eps("10.244.1.5:53,local", "10.244.2.6:53"))))}},
		{"itp-local-no-local-endpoints", cfg, []step{full(snapshot(v4, node,
			port("default/itp", "", v1.ProtocolUDP, "10.96.0.70", 53, itpLocal, eps("10.244.2.6:53")),
			port("default/itp-np", "", v1.ProtocolTCP, "10.96.0.71", 80, itpLocal, nodePort(30071), eps("10.244.2.6:80"))))}},
		{"no-endpoints", cfg, []step{full(snapshot(v4, node,
			port("default/empty", "p", v1.ProtocolTCP, "10.96.0.80", 80, nodePort(30080), externalIPs("192.0.2.80"),
				lbIPs("203.0.113.80"), sourceRanges("198.51.100.0/24")),
			port("default/not-ready", "", v1.ProtocolTCP, "10.96.0.81", 80, eps("10.244.2.6:80,notready"))))}},
		{"masquerade-all", with(cfg, func(c *Config) { c.MasqueradeAll, c.TCPBeLiberal, c.MasqueradeBit = true, true, 12 }),
			[]step{full(snapshot(v4, node, npSvc()))}},
		// Bit 0 is mark 0x1, formatted as upstream formats marks.
		{"masquerade-bit-0", configFrom(func(c *config.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr(int32(0)) }),
			[]step{full(snapshot(v4, node, npSvc()))}},
		// A bindAddress is the primary IP: "primary" NodePorts answer on it, and a source range holding it
		// (but not the Node's first IP) lets the node's own requests to the load balancer through.
		{"bind-address", configFrom(func(c *config.KubeProxyConfiguration) {
			c.BindAddress, c.NodePortAddresses = "10.0.0.9", []string{"primary"}
		}), []step{full(snapshot(v4, node,
			port("default/lb", "https", v1.ProtocolTCP, "10.96.0.50", 443, nodePort(30444),
				lbIPs("203.0.113.20"), sourceRanges("198.51.100.0/24", "10.0.0.8/30"), eps("10.244.2.6:8443"))))}},
		{"detect-local-none", noDetect, []step{full(snapshot(v4, node, lbLocal()))}},
		{"detect-local-clustercidr", cfg, []step{full(snapshot(v4, node, lbLocal()))}},
		{"detect-local-nodecidr", testConfig(v4, proxy.LocalDetector{Mode: config.LocalModeNodeCIDR}),
			[]step{full(snapshot(v4, nodeWithCIDR, lbLocal()))}},
		{"detect-local-bridge", testConfig(v4, proxy.LocalDetector{Mode: config.LocalModeBridgeInterface, Interface: "cbr0"}),
			[]step{full(snapshot(v4, node, lbLocal()))}},
		{"detect-local-ifprefix", testConfig(v4, proxy.LocalDetector{Mode: config.LocalModeInterfaceNamePrefix, Interface: "veth"}),
			[]step{full(snapshot(v4, node, lbLocal()))}},
		{"multiport", cfg, []step{full(snapshot(v4, node,
			port("default/multi", "http", v1.ProtocolTCP, "10.96.0.90", 80, eps("10.244.2.6:8080", "10.244.3.7:8080")),
			port("default/multi", "https", v1.ProtocolTCP, "10.96.0.90", 443, eps("10.244.2.6:8443", "10.244.3.7:8443"))))}},
		{"protocols", cfg, []step{full(snapshot(v4, node,
			port("kube-system/dns", "dns-tcp", v1.ProtocolTCP, "10.96.0.10", 53, eps("10.244.2.6:53")),
			port("kube-system/dns", "dns", v1.ProtocolUDP, "10.96.0.10", 53, eps("10.244.2.6:53")),
			port("kube-system/dns", "dns-sctp", v1.ProtocolSCTP, "10.96.0.10", 53, nodePort(30053), eps("10.244.2.6:53"))))}},
		{"terminating-fallback", cfg, []step{full(snapshot(v4, node,
			port("default/rolling", "", v1.ProtocolTCP, "10.96.0.100", 80, nodePort(30100), etpLocal(31100),
				eps("10.244.1.5:80,local,notready,terminating", "10.244.2.6:80,notready,terminating",
					"10.244.3.7:80,notready,terminating,notserving"))))}},
		{"ipv6", with(testConfig(v6, clusterCIDR("fd00:10:244::/48")), func(c *Config) { c.LocalhostNodePorts = true }), []step{full(snapshot(v6,
			proxy.Node{Name: testNode, Known: true, IPs: []netipAddr{mustAddr("fd00::1")}},
			port("default/np6", "", v1.ProtocolTCP, "fd00:96::20", 80, nodePort(30080), lbIPs("2001:db8::10"),
				sourceRanges("2001:db8:1::/48"), affinity(60), eps("[fd00:10:244:1::5]:8080,local", "[fd00:10:244:2::6]:8080"))))}},
		{"large", cfg, []step{full(snapshot(v4, node, port("default/large", "", v1.ProtocolTCP, "10.96.0.110", 80, eps(many...))))}},
		{"partial-endpoint-change", cfg, []step{full(base), partial(epChanged)}},
		{"partial-service-deletion", cfg, []step{full(twoSvcs), partial(oneLeft)}},
		{"full-stale-existing", cfg, []step{{snap: seed000(), full: true, existing: map[string][]string{
			"nat": {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY",
				"KUBE-SVC-KUSV3H3OUX7H3MDQ", "KUBE-SEP-HHZALBXPKUQGKXIS", "KUBE-SVC-STALESTALESTALE1", "KUBE-SEP-STALESTALESTALE2",
				"KUBE-EXT-STALESTALESTALE3", "KUBE-FW-STALESTALESTALE4", "KUBE-SVL-STALESTALESTALE5", "KUBE-OTHER-CHAIN"},
			"filter": {"KUBE-SERVICES", "KUBE-FORWARD"}}}}},
	}
}

// renderCase runs a case's steps and returns every step's result (the payload copied).
func renderCase(t testing.TB, gc goldenCase) ([]*Result, [][]byte) {
	t.Helper()
	r := NewRenderer(gc.cfg)
	var results []*Result
	var payloads [][]byte
	var prev *proxy.Snapshot
	for i, s := range gc.steps {
		res, err := r.Render(s.snap, prev, s.full, s.existing)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		results = append(results, res)
		payloads = append(payloads, slices.Clone(res.Payload))
		prev = s.snap
	}
	return results, payloads
}

func summary(res *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# rules written: filter=%d nat=%d; total: filter=%d nat=%d; full=%v\n",
		res.Rules["filter"], res.Rules["nat"], res.RulesTotal["filter"], res.RulesTotal["nat"], res.Full)
	for _, tbl := range []string{"filter", "nat"} {
		if n := len(res.Chains[tbl]); n > 40 {
			fmt.Fprintf(&b, "# %s chains: %d\n", tbl, n)
		} else {
			fmt.Fprintf(&b, "# %s chains: %s\n", tbl, strings.Join(res.Chains[tbl], " "))
		}
		if len(res.Deleted[tbl]) > 0 {
			fmt.Fprintf(&b, "# %s deleted: %s\n", tbl, strings.Join(res.Deleted[tbl], " "))
		}
	}
	return b.String()
}

// checkGolden compares got with testdata/name.golden, or rewrites it with -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n")); diff != "" {
		t.Errorf("%s differs (-want +got; go test -update rewrites it):\n%s", path, diff)
	}
}

func TestGolden(t *testing.T) {
	for _, gc := range goldenCases() {
		t.Run(gc.name, func(t *testing.T) {
			results, payloads := renderCase(t, gc)
			last := len(results) - 1
			checkGolden(t, gc.name, append([]byte(summary(results[last])), payloads[last]...))

			// Every step must load into the fake kernel in order, and after a partial step the state must
			// equal what a full render of the same snapshot gives.
			ts := iptrace.New(gc.cfg.Family == v6)
			for i, p := range payloads {
				if err := ts.Restore(p, iptrace.RestoreOptions{NoFlush: true}); err != nil {
					t.Fatalf("step %d does not load: %v", i, err)
				}
			}
			if !gc.steps[last].full {
				fresh := iptrace.New(gc.cfg.Family == v6)
				_, fp := renderCase(t, goldenCase{cfg: gc.cfg, steps: []step{full(gc.steps[last].snap)}})
				if err := fresh.Restore(fp[0], iptrace.RestoreOptions{NoFlush: true}); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(fresh.SaveAll(), ts.SaveAll()); diff != "" {
					t.Errorf("state after the partial render differs from a full render (-full +partial):\n%s", diff)
				}
			}
		})
	}
}
