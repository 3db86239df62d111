package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/internal/tracecases"
	"kube-proxy/rules/iptables/iptrace"
)

// jumpPayload returns an iptables-restore payload (for --noflush) that creates the jump rules the way the
// writer does: missing target chains created, each rule inserted at the top of its built-in chain in
// JumpRules order, so the result matches upstream's successive `iptables -I`.
func jumpPayload(cfg Config, have map[string][]string) []byte {
	var b strings.Builder
	for _, table := range []string{"filter", "nat"} {
		b.WriteString("*" + table + "\n")
		declared := map[string]bool{}
		for _, j := range JumpRules(cfg) {
			if j.Table == table && !slices.Contains(have[table], j.Target) && !declared[j.Target] {
				b.WriteString(":" + j.Target + " - [0:0]\n")
				declared[j.Target] = true
			}
		}
		for _, j := range JumpRules(cfg) {
			if j.Table != table {
				continue
			}
			b.WriteString("-I " + j.Chain + " 1")
			for _, a := range j.RuleSpec() {
				if strings.Contains(a, " ") {
					a = `"` + a + `"`
				}
				b.WriteString(" " + a)
			}
			b.WriteString("\n")
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// kernelState renders snap fully and returns the fake kernel holding the payload and the jump rules.
func kernelState(t *testing.T, cfg Config, snap *proxy.Snapshot) *iptrace.Tables {
	t.Helper()
	res, err := NewRenderer(cfg).Render(snap, nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := iptrace.New(cfg.Family == v1.IPv6Protocol)
	if err := ts.Restore(res.Payload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatalf("payload: %v", err)
	}
	if err := ts.Restore(jumpPayload(cfg, res.Chains), iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatalf("jump rules: %v", err)
	}
	return ts
}

// Sources of traffic in the case table.
type source struct {
	name   string
	src    string
	in     string // arriving interface; "" for traffic from the node itself
	recent []string
}

var (
	fromPod       = source{name: "local pod", src: "10.244.1.7", in: "veth7"}
	fromOtherNode = source{name: "other node", src: "192.168.0.2", in: "eth0"}
	fromOutside   = source{name: "outside client", src: "198.51.100.9", in: "eth0"}
	fromNode      = source{name: "node itself", src: "10.0.0.1"}
	fromLocalhost = source{name: "localhost", src: "127.0.0.1"}
)

// expect is the outcome of one trace: reachable endpoints (sorted), whether traffic is masqueraded, and
// the verdicts.
type expect struct {
	Endpoints []string
	Masq      bool
	Verdicts  []string
}

func reach(masq bool, endpoints ...string) expect {
	return expect{Endpoints: endpoints, Masq: masq, Verdicts: []string{"ACCEPT"}}
}

var (
	dropped   = expect{Verdicts: []string{"DROP"}}
	rejected  = expect{Verdicts: []string{"REJECT"}}
	untouched = expect{Verdicts: []string{"ACCEPT"}}
)

const (
	localEP  = "10.244.1.5:8080"
	remoteEP = "10.244.2.6:8080"
)

// TestTraceCases runs the table of truth every mode shares (rules/internal/tracecases) through the
// rendered rules.
func TestTraceCases(t *testing.T) {
	snap := tracecases.Snapshot()
	cfg := with(testConfig(v4, clusterCIDR(tracecases.ClusterCIDR)), func(c *Config) { c.LocalhostNodePorts = true })
	ts := kernelState(t, cfg, snap)
	tracecases.Run(t, tracecases.IPTables, func(p tracecases.Packet) (tracecases.Outcome, string, error) {
		var recent []string
		if p.From.StickyTo != "" {
			recent = []string{EndpointChainName(tracecases.StickyService, p.From.StickyTo)}
		}
		res, err := ts.Trace(iptrace.Packet{Src: p.From.Src, Dst: p.Dst.Addr(), DPort: p.Dst.Port(), Protocol: p.Protocol,
			InIface: p.From.In, Local: p.From.In == "", LocalAddrs: p.LocalAddrs, Recent: recent})
		if err != nil {
			return tracecases.Outcome{}, "", err
		}
		masq, ok := res.Masquerade()
		if !ok {
			return tracecases.Outcome{}, res.String(), fmt.Errorf("some branches masqueraded, some not:\n%s", res)
		}
		return tracecases.Outcome{Endpoints: res.Endpoints(), Masq: masq, Verdicts: res.Verdicts()}, res.String(), nil
	})
}

// TestTraceLocalhostNodePorts checks that NodePorts do not answer on localhost when they must not: IPv4
// without localhostNodePorts, and IPv6 always.
func TestTraceLocalhostNodePorts(t *testing.T) {
	v4snap := snapshot(v4, v4Node("10.0.0.1"), port("t/np", "", v1.ProtocolTCP, "10.96.1.2", 80, nodePort(30002), eps(remoteEP)))
	ts := kernelState(t, testConfig(v4, proxy.LocalDetector{}), v4snap)
	if got, res := trace(t, ts, fromLocalhost, "127.0.0.1:30002", "tcp"); !cmp.Equal(got, untouched) {
		t.Errorf("IPv4 localhost NodePort without localhostNodePorts: got %+v\n%s", got, res)
	}
	if got, res := trace(t, ts, fromNode, "10.0.0.1:30002", "tcp"); !cmp.Equal(got, reach(true, remoteEP)) {
		t.Errorf("IPv4 NodePort on the node IP: got %+v\n%s", got, res)
	}

	ep6 := "[fd00:10:244:2::6]:8080"
	v6snap := snapshot(v6, proxy.Node{Name: testNode, IPs: []netip.Addr{mustAddr("fd00::1")}},
		port("t/np", "", v1.ProtocolTCP, "fd00:96::2", 80, nodePort(30002), eps(ep6)))
	ts6 := kernelState(t, with(testConfig(v6, proxy.LocalDetector{}), func(c *Config) { c.LocalhostNodePorts = true }), v6snap)
	if got, res := trace(t, ts6, source{name: "localhost6", src: "::1"}, "[::1]:30002", "tcp"); !cmp.Equal(got, untouched) {
		t.Errorf("IPv6 localhost NodePort: got %+v\n%s", got, res)
	}
	if got, res := trace(t, ts6, source{name: "other node", src: "fd00::2", in: "eth0"}, "[fd00::1]:30002", "tcp"); !cmp.Equal(got, reach(true, ep6)) {
		t.Errorf("IPv6 NodePort: got %+v\n%s", got, res)
	}
}

func trace(t *testing.T, ts *iptrace.Tables, from source, dst, proto string) (expect, *iptrace.Result) {
	t.Helper()
	d := netip.MustParseAddrPort(dst)
	pkt := iptrace.Packet{
		Src:        mustAddr(from.src),
		Dst:        d.Addr(),
		DPort:      d.Port(),
		Protocol:   proto,
		InIface:    from.in,
		Local:      from.in == "",
		LocalAddrs: []netip.Addr{mustAddr("10.0.0.1"), mustAddr("fd00::1")},
		Recent:     from.recent,
	}
	res, err := ts.Trace(pkt)
	if err != nil {
		t.Fatal(err)
	}
	masq, ok := res.Masquerade()
	if !ok {
		t.Errorf("some branches masqueraded, some not:\n%s", res)
	}
	got := expect{Endpoints: res.Endpoints(), Masq: masq, Verdicts: res.Verdicts()}
	if slices.Contains(got.Verdicts, "DROP") || slices.Contains(got.Verdicts, "REJECT") {
		got.Masq = false // a dropped packet reaches no POSTROUTING
	}
	return got, res
}

// TestTraceMasqueradeBit0: iptables.masqueradeBit 0 is mark 0x1; traffic needing SNAT is marked with it
// and masqueraded, and iptables-save shows the marks as it does for upstream's rules with bit 0
// (TestGoldenKernel checks the tracer's iptables-save against the kernel's).
func TestTraceMasqueradeBit0(t *testing.T) {
	cfg := configFrom(func(c *config.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr(int32(0)) })
	snap := snapshot(v4, v4Node("10.0.0.1"), port("t/np", "", v1.ProtocolTCP, "10.96.1.2", 80, nodePort(30002), eps(remoteEP)))
	ts := kernelState(t, cfg, snap)
	saved := ts.Save("nat") + ts.Save("filter")
	for _, want := range []string{
		"-A KUBE-MARK-MASQ -j MARK --set-xmark 0x1/0x1",
		"-A KUBE-POSTROUTING -m mark ! --mark 0x1/0x1 -j RETURN",
		`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x1/0x1 -j ACCEPT`,
	} {
		if !slices.Contains(strings.Split(saved, "\n"), want) {
			t.Errorf("iptables-save lacks %q:\n%s", want, saved)
		}
	}
	if got, res := trace(t, ts, fromOtherNode, "10.0.0.1:30002", "tcp"); !cmp.Equal(got, reach(true, remoteEP)) {
		t.Errorf("NodePort with masqueradeBit 0: got %+v\n%s", got, res)
	}
	if got, res := trace(t, ts, fromPod, "10.96.1.2:80", "tcp"); !cmp.Equal(got, reach(false, remoteEP)) {
		t.Errorf("cluster IP from a local pod with masqueradeBit 0: got %+v\n%s", got, res)
	}
}

// TestTraceBindAddress: a bindAddress other than the Node's first IP is the node's primary IP, as upstream
// decides it: "primary" NodePorts answer on it (and not on the Node's first IP), and a
// loadBalancerSourceRanges entry that holds it lets the node reach the load balancer from the load
// balancer's own address.
func TestTraceBindAddress(t *testing.T) {
	cfg := configFrom(func(c *config.KubeProxyConfiguration) {
		c.BindAddress, c.NodePortAddresses = "10.0.0.9", []string{"primary"}
	})
	snap := snapshot(v4, v4Node("10.0.0.1"), port("t/fw", "", v1.ProtocolTCP, "10.96.1.7", 80, nodePort(30007),
		lbIPs("203.0.113.7"), sourceRanges("10.0.0.8/30"), eps(remoteEP)))
	ts := kernelState(t, cfg, snap)
	fromVIP := source{name: "node, from the load balancer IP", src: "203.0.113.7"}
	for _, tc := range []struct {
		dst  string
		from source
		want expect
	}{
		{"10.0.0.9:30007", fromOtherNode, reach(true, remoteEP)},
		{"10.0.0.1:30007", fromOtherNode, untouched},
		{"203.0.113.7:80", fromVIP, reach(true, remoteEP)},
		{"203.0.113.7:80", fromOutside, dropped},
	} {
		if got, res := trace(t, ts, tc.from, tc.dst, "tcp"); !cmp.Equal(got, tc.want) {
			t.Errorf("%s -> %s: got %+v, want %+v\n%s", tc.from.name, tc.dst, got, tc.want, res)
		}
	}
}
