package nftrace

import (
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var (
	node4 = []netip.Addr{netip.MustParseAddr("192.168.0.2")}
	node6 = []netip.Addr{netip.MustParseAddr("2001:db8::1")}
)

func nodeAddrs(a netip.Addr) []netip.Addr {
	if a.Is4() {
		return node4
	}
	return node6
}

// fromPod, fromOutside and fromNode make the first packet of a TCP connection; the protocol can be changed
// with udp().
func fromPod(src, dst string, port uint16) Packet {
	p := Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: "tcp", DPort: port, InIface: "veth1"}
	p.LocalAddrs = nodeAddrs(p.Dst)
	return p
}

func fromOutside(src, dst string, port uint16) Packet {
	p := fromPod(src, dst, port)
	p.InIface = "eth0"
	return p
}

func fromNode(src, dst string, port uint16) Packet {
	p := fromPod(src, dst, port)
	p.InIface, p.Local = "", true
	return p
}

func udp(p Packet) Packet {
	p.Protocol = "udp"
	return p
}

func withAffinity(p Packet, sets ...string) Packet {
	p.Affinity = sets
	return p
}

const (
	aff5Local  = "affinity-ZP3M6QJD-ns5/svc5/tcp/p80__10.180.0.5/80"
	aff5Remote = "affinity-W7CK5NLF-ns5/svc5/tcp/p80__10.180.2.5/80"
	aff6       = "affinity-GTK6MW7G-ns3/svc3/tcp/p80__fd00.10..180.3/80"
)

// traceWant is what a trace must give.
type traceWant struct {
	endpoints []string // Result.Endpoints
	verdicts  []string // Result.Verdicts
	masq      []string // the endpoints (or "" without DNAT) of the masqueraded outcomes, sorted
	hook      string   // if set, the Hook of every outcome
	affinity  []string // every set any outcome added the source to, sorted
	prob      float64  // if set, the probability of every outcome
}

var accepted = []string{"ACCEPT"}

var addrPortEqual = cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })

// traceCases run over testdata/upstream4.nft and upstream6.nft (node 192.168.0.2 / 2001:db8::1, pods in
// 10.0.0.0/8 / fd00:10::/64); see the comments there for the services.
var traceCases = []struct {
	name string
	pkt  Packet
	want traceWant
}{
	{"clusterIP spread from a pod",
		fromPod("10.0.0.5", "172.30.0.41", 80),
		traceWant{endpoints: []string{"10.180.0.1:80", "10.180.2.1:80"}, verdicts: accepted, prob: 0.5, hook: "ip kube-proxy nat-postrouting"}},
	{"clusterIP from outside the cluster is masqueraded",
		fromOutside("192.168.0.9", "172.30.0.41", 80),
		traceWant{endpoints: []string{"10.180.0.1:80", "10.180.2.1:80"}, verdicts: accepted, masq: []string{"10.180.0.1:80", "10.180.2.1:80"}, prob: 0.5}},
	{"clusterIP from the node is masqueraded",
		fromNode("192.168.0.2", "172.30.0.41", 80),
		traceWant{endpoints: []string{"10.180.0.1:80", "10.180.2.1:80"}, verdicts: accepted, masq: []string{"10.180.0.1:80", "10.180.2.1:80"}, hook: "ip kube-proxy nat-postrouting"}},
	{"hairpin: an endpoint reaching itself is masqueraded",
		fromPod("10.180.0.1", "172.30.0.41", 80),
		traceWant{endpoints: []string{"10.180.0.1:80", "10.180.2.1:80"}, verdicts: accepted, masq: []string{"10.180.0.1:80"}}},
	{"NodePort from outside",
		fromOutside("203.0.113.2", "192.168.0.2", 3003),
		traceWant{endpoints: []string{"10.180.0.3:80"}, verdicts: accepted, masq: []string{"10.180.0.3:80"}, prob: 1}},
	{"NodePort port on another host's address is not ours",
		fromOutside("203.0.113.2", "192.168.0.99", 3003),
		traceWant{verdicts: accepted, hook: "ip kube-proxy nat-postrouting"}},
	{"NodePort of another protocol is not ours",
		udp(fromOutside("203.0.113.2", "192.168.0.2", 3003)),
		traceWant{verdicts: accepted, hook: "ip kube-proxy filter-input"}},
	{"no endpoints: rejected from a pod",
		fromPod("10.0.0.5", "172.30.0.46", 80),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-forward"}},
	{"no endpoints: rejected from the node",
		fromNode("192.168.0.2", "172.30.0.46", 80),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-output"}},
	{"no endpoints: NodePort rejected",
		fromOutside("203.0.113.2", "192.168.0.2", 3006),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-input"}},
	{"externalTrafficPolicy Local without local endpoints: LoadBalancer IP dropped",
		fromOutside("203.0.113.2", "5.6.7.8", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip kube-proxy filter-forward"}},
	{"externalTrafficPolicy Local without local endpoints: externalIP dropped",
		fromOutside("203.0.113.2", "192.168.99.22", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip kube-proxy filter-forward"}},
	{"externalTrafficPolicy Local without local endpoints: NodePort dropped",
		fromOutside("203.0.113.2", "192.168.0.2", 3001),
		traceWant{verdicts: []string{"DROP"}, hook: "ip kube-proxy filter-input"}},
	{"externalTrafficPolicy Local: pods short-circuit to every endpoint",
		fromPod("10.0.0.5", "5.6.7.8", 80),
		traceWant{endpoints: []string{"10.180.2.2:80"}, verdicts: accepted}},
	{"externalTrafficPolicy Local: the node short-circuits, masqueraded",
		fromNode("192.168.0.2", "5.6.7.8", 80),
		traceWant{endpoints: []string{"10.180.2.2:80"}, verdicts: accepted, masq: []string{"10.180.2.2:80"}}},
	{"externalTrafficPolicy Local with a local endpoint keeps the source",
		fromOutside("203.0.113.2", "5.6.7.9", 80),
		traceWant{endpoints: []string{"10.180.0.4:80"}, verdicts: accepted, prob: 1}},
	{"externalTrafficPolicy Local NodePort",
		fromOutside("203.0.113.2", "192.168.0.2", 3004),
		traceWant{endpoints: []string{"10.180.0.4:80"}, verdicts: accepted}},
	{"externalTrafficPolicy Local: the clusterIP uses every endpoint",
		fromPod("10.0.0.5", "172.30.0.44", 80),
		traceWant{endpoints: []string{"10.180.0.4:80", "10.180.2.4:80"}, verdicts: accepted, prob: 0.5}},
	{"loadBalancerSourceRanges drops other sources",
		fromOutside("203.0.113.130", "5.6.7.10", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip kube-proxy filter-prerouting-pre-dnat"}},
	{"loadBalancerSourceRanges drops the node",
		fromNode("192.168.0.2", "5.6.7.10", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip kube-proxy filter-output-pre-dnat"}},
	{"loadBalancerSourceRanges lets listed sources in; affinity is recorded",
		fromOutside("203.0.113.2", "5.6.7.10", 80),
		traceWant{endpoints: []string{"10.180.0.5:80", "10.180.2.5:80"}, verdicts: accepted, masq: []string{"10.180.0.5:80", "10.180.2.5:80"},
			affinity: []string{aff5Remote, aff5Local}, prob: 0.5}},
	{"affinity: a known client reaches only its endpoint",
		withAffinity(fromOutside("203.0.113.2", "5.6.7.10", 80), aff5Remote),
		traceWant{endpoints: []string{"10.180.2.5:80"}, verdicts: accepted, masq: []string{"10.180.2.5:80"}, affinity: []string{aff5Remote}, prob: 1}},
	{"affinity through the clusterIP",
		withAffinity(fromPod("10.0.0.5", "172.30.0.45", 80), aff5Local),
		traceWant{endpoints: []string{"10.180.0.5:80"}, verdicts: accepted, affinity: []string{aff5Local}, prob: 1}},
	{"cluster-ips-check rejects an unknown port",
		fromPod("10.0.0.5", "172.30.0.41", 81),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-forward"}},
	{"cluster-ips-check rejects an unknown protocol",
		fromPod("10.0.0.5", "172.30.0.47", 53),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-forward"}},
	{"cluster-ips-check rejects an unknown port from the node",
		fromNode("192.168.0.2", "172.30.0.41", 81),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-output"}},
	{"unallocated clusterIP dropped",
		fromPod("10.0.0.5", "172.30.9.9", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip kube-proxy filter-forward"}},
	{"UDP clusterIP",
		udp(fromPod("10.0.0.5", "172.30.0.47", 53)),
		traceWant{endpoints: []string{"10.180.2.7:53"}, verdicts: accepted}},
	{"localhost NodePort rejected",
		Packet{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.1"), Protocol: "tcp", DPort: 3003, InIface: "lo", LocalAddrs: node4},
		traceWant{verdicts: []string{"REJECT"}, hook: "ip kube-proxy filter-input"}},
	{"localhost port without a reject",
		Packet{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.1"), Protocol: "tcp", DPort: 3004, InIface: "lo", LocalAddrs: node4},
		traceWant{verdicts: accepted, hook: "ip kube-proxy filter-input"}},
	{"other traffic passes",
		udp(fromPod("10.0.0.5", "8.8.8.8", 53)),
		traceWant{verdicts: accepted, hook: "ip kube-proxy nat-postrouting", prob: 1}},

	{"IPv6 clusterIP spread from a pod",
		fromPod("fd00:10::5", "fd00:172:30::41", 80),
		traceWant{endpoints: []string{"[fd00:10::180:1]:80", "[fd00:10::280:1]:80"}, verdicts: accepted, prob: 0.5, hook: "ip6 kube-proxy nat-postrouting"}},
	{"IPv6 clusterIP from outside the cluster is masqueraded",
		fromOutside("2001:db8:1::9", "fd00:172:30::41", 80),
		traceWant{endpoints: []string{"[fd00:10::180:1]:80", "[fd00:10::280:1]:80"}, verdicts: accepted, masq: []string{"[fd00:10::180:1]:80", "[fd00:10::280:1]:80"}}},
	{"IPv6 clusterIP from the node",
		fromNode("2001:db8::1", "fd00:172:30::41", 80),
		traceWant{endpoints: []string{"[fd00:10::180:1]:80", "[fd00:10::280:1]:80"}, verdicts: accepted, masq: []string{"[fd00:10::180:1]:80", "[fd00:10::280:1]:80"}}},
	{"IPv6 hairpin",
		fromPod("fd00:10::180:1", "fd00:172:30::41", 80),
		traceWant{endpoints: []string{"[fd00:10::180:1]:80", "[fd00:10::280:1]:80"}, verdicts: accepted, masq: []string{"[fd00:10::180:1]:80"}}},
	{"IPv6 NodePort on a nodeport-ips address",
		fromOutside("2001:db8:1::9", "2001:db8::1", 3002),
		traceWant{endpoints: []string{"[fd00:10::280:2]:8080"}, verdicts: accepted, masq: []string{"[fd00:10::280:2]:8080"}}},
	{"IPv6 affinity recorded",
		fromPod("fd00:10::5", "fd00:172:30::43", 80),
		traceWant{endpoints: []string{"[fd00:10::180:3]:80"}, verdicts: accepted, affinity: []string{aff6}, prob: 1}},
	{"IPv6 affinity followed",
		withAffinity(fromPod("fd00:10::5", "fd00:172:30::43", 80), aff6),
		traceWant{endpoints: []string{"[fd00:10::180:3]:80"}, verdicts: accepted, affinity: []string{aff6}, prob: 1}},
	{"IPv6 no endpoints: rejected",
		fromPod("fd00:10::5", "fd00:172:30::44", 80),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip6 kube-proxy filter-forward"}},
	{"IPv6 no endpoints: NodePort rejected",
		fromOutside("2001:db8:1::9", "2001:db8::1", 3004),
		traceWant{verdicts: []string{"REJECT"}, hook: "ip6 kube-proxy filter-input"}},
	{"IPv6 loadBalancerSourceRanges drops other sources",
		fromOutside("2001:db8:204::1", "2001:db8:99::5", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip6 kube-proxy filter-prerouting-pre-dnat"}},
	{"IPv6 externalTrafficPolicy Local without local endpoints drops listed sources",
		fromOutside("2001:db8:203::7", "2001:db8:99::5", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip6 kube-proxy filter-forward"}},
	{"IPv6 loadBalancerSourceRanges apply to pods too",
		fromPod("fd00:10::5", "2001:db8:99::5", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip6 kube-proxy filter-prerouting-pre-dnat"}},
	{"IPv6 externalTrafficPolicy Local: pods short-circuit through the clusterIP",
		fromPod("fd00:10::5", "fd00:172:30::45", 80),
		traceWant{endpoints: []string{"[fd00:10::280:5]:80"}, verdicts: accepted}},
	{"IPv6 unallocated clusterIP dropped",
		fromPod("fd00:10::5", "fd00:172:30::99", 80),
		traceWant{verdicts: []string{"DROP"}, hook: "ip6 kube-proxy filter-forward"}},
}

func loadUpstream(t *testing.T) *Tables {
	t.Helper()
	ts := New()
	mustLoad(t, ts, readFile(t, "upstream4.nft"), readFile(t, "upstream6.nft"))
	return ts
}

func TestTrace(t *testing.T) {
	ts := loadUpstream(t)
	for _, tc := range traceCases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ts.Trace(tc.pkt)
			if err != nil {
				t.Fatal(err)
			}
			checkTrace(t, res, tc.want)
		})
	}
}

func checkTrace(t *testing.T, res *Result, want traceWant) {
	t.Helper()
	got := traceWant{endpoints: res.Endpoints(), verdicts: res.Verdicts(), hook: want.hook, prob: want.prob}
	sum := 0.0
	for _, o := range res.Outcomes {
		if o.Masquerade {
			got.masq = append(got.masq, o.Endpoint)
		}
		got.affinity = append(got.affinity, o.Remembered...)
		if want.hook != "" && o.Hook != want.hook {
			got.hook = o.Hook
		}
		if want.prob != 0 && math.Abs(o.Probability-want.prob) > 1e-9 {
			got.prob = o.Probability
		}
		sum += o.Probability
	}
	slices.Sort(got.masq)
	slices.Sort(got.affinity)
	got.affinity = slices.Compact(got.affinity)
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(traceWant{})); diff != "" {
		t.Errorf("(-want +got):\n%s\n%s", diff, res)
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("probabilities sum to %v:\n%s", sum, res)
	}
}

func TestTraceDetails(t *testing.T) {
	ts := loadUpstream(t)
	res, err := ts.Trace(fromOutside("203.0.113.2", "192.168.0.2", 3003))
	if err != nil {
		t.Fatal(err)
	}
	want := &Result{Outcomes: []Outcome{{
		Verdict:     "ACCEPT",
		Hook:        "ip kube-proxy nat-postrouting",
		Dst:         netip.MustParseAddrPort("10.180.0.3:80"),
		Endpoint:    "10.180.0.3:80",
		Masquerade:  true,
		Probability: 1,
		Path: []string{"filter-prerouting-pre-dnat", "firewall-check", "nat-prerouting", "services",
			"external-3VHN2JBC-ns3/svc3/tcp/p80", "service-3VHN2JBC-ns3/svc3/tcp/p80",
			"filter-forward", "service-endpoints-check", "cluster-ips-check", "nat-postrouting", "masquerading"},
		Rules: []string{
			"filter-prerouting-pre-dnat: ct state new jump firewall-check",
			"nat-prerouting: jump services",
			"services: fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
			"external-3VHN2JBC-ns3/svc3/tcp/p80: goto service-3VHN2JBC-ns3/svc3/tcp/p80",
			"service-3VHN2JBC-ns3/svc3/tcp/p80: meta l4proto tcp dnat to 10.180.0.3:80",
			"filter-forward: ct state new jump service-endpoints-check",
			"filter-forward: ct state new jump cluster-ips-check",
			"nat-postrouting: jump masquerading",
			"masquerading: mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random",
		},
	}}}
	if diff := cmp.Diff(want, res, addrPortEqual); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if m, ok := res.Masquerade(); !m || !ok {
		t.Errorf("Masquerade() = %v, %v", m, ok)
	}
	const wantString = "ACCEPT at ip kube-proxy nat-postrouting p=1.0000 dnat=10.180.0.3:80 masquerade via " +
		"filter-prerouting-pre-dnat firewall-check nat-prerouting services external-3VHN2JBC-ns3/svc3/tcp/p80 " +
		"service-3VHN2JBC-ns3/svc3/tcp/p80 filter-forward service-endpoints-check cluster-ips-check nat-postrouting masquerading\n"
	if res.String() != wantString {
		t.Errorf("String() = %q", res.String())
	}
	hairpin, err := ts.Trace(fromPod("10.180.0.1", "172.30.0.41", 80))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hairpin.Masquerade(); ok {
		t.Errorf("hairpin: Masquerade() should report mixed outcomes:\n%s", hairpin)
	}
	// The masquerade mark is cleared before masquerading.
	for _, o := range hairpin.Outcomes {
		if o.Mark != 0 {
			t.Errorf("mark %#x left on %s", o.Mark, o.Endpoint)
		}
	}
}

// semantics is a synthetic table for the walk's rules: base chain order, accept ending only one base
// chain, policies, return, goto, numgen with a missing index, nat chains skipped after a DNAT, vmap misses.
const semantics = `add table ip kube-proxy
add chain ip kube-proxy late { type filter hook prerouting priority 10 ; }
add chain ip kube-proxy early { type filter hook prerouting priority raw ; }
add chain ip kube-proxy same-a { type filter hook prerouting priority 10 ; }
add chain ip kube-proxy nat1 { type nat hook prerouting priority dstnat ; }
add chain ip kube-proxy nat2 { type nat hook prerouting priority dstnat + 1 ; }
add chain ip kube-proxy fwd { type filter hook forward priority 0 ; policy drop ; }
add chain ip kube-proxy in { type filter hook input priority 0 ; }
add chain ip kube-proxy post { type nat hook postrouting priority srcnat ; }
add chain ip kube-proxy sub
add chain ip kube-proxy gone
add chain ip kube-proxy pick
add rule ip kube-proxy early iifname "eth*" mark set mark or 0x1
add rule ip kube-proxy early accept
add rule ip kube-proxy early mark set mark or 0x100
add rule ip kube-proxy late mark 0x1 jump sub
add rule ip kube-proxy late mark set mark or 0x4
add rule ip kube-proxy same-a mark and 0x4 != 0 mark set mark or 0x8
add rule ip kube-proxy sub mark set mark or 0x2
add rule ip kube-proxy sub return
add rule ip kube-proxy sub mark set mark or 0x200
add rule ip kube-proxy nat1 ip daddr 10.96.0.1 goto pick
add rule ip kube-proxy nat1 ip daddr 10.96.0.2 meta l4proto tcp dnat to 10.0.0.7
add rule ip kube-proxy nat2 meta l4proto tcp dnat to 10.0.0.99:1
add rule ip kube-proxy pick numgen random mod 4 vmap { 0 : goto gone, 1 : jump gone, 3 : drop }
add rule ip kube-proxy pick ip daddr . th dport vmap { 10.96.0.9 . 1 : drop }
add rule ip kube-proxy pick meta l4proto tcp dnat to 10.0.0.8:8080
add rule ip kube-proxy gone ct status dnat drop
add rule ip kube-proxy gone ip saddr 192.0.2.1 return
add rule ip kube-proxy fwd ct status dnat ip daddr 10.0.0.8 accept
add rule ip kube-proxy fwd ip daddr 10.0.0.7 tcp dport 80 accept
add rule ip kube-proxy post ct status dnat masquerade
`

func TestTraceSemantics(t *testing.T) {
	ts := New()
	mustLoad(t, ts, semantics)
	pkt := func(src, dst string) Packet {
		return Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: "tcp", DPort: 80, InIface: "eth0"}
	}
	t.Run("base chain order, accept, return and marks", func(t *testing.T) {
		res, err := ts.Trace(pkt("192.0.2.1", "10.96.0.2"))
		if err != nil {
			t.Fatal(err)
		}
		o := res.Outcomes[0]
		// early (raw) accepts before setting 0x100; late (10, created first) jumps to sub, which returns
		// before 0x200, then sets 0x4; same-a (10, created later) sees 0x4.
		if len(res.Outcomes) != 1 || o.Mark != 0x1|0x2|0x4|0x8 {
			t.Errorf("mark %#x, want 0xf:\n%s", o.Mark, res)
		}
		want := []string{"early", "nat1", "late", "sub", "same-a", "fwd", "post"}
		if diff := cmp.Diff(want, o.Path); diff != "" {
			t.Errorf("path (-want +got):\n%s", diff)
		}
		// nat2 is skipped after nat1's DNAT; the port is kept without one in the rule; forward accepts.
		if o.Verdict != "ACCEPT" || o.Endpoint != "10.0.0.7:80" || !o.Masquerade {
			t.Errorf("got %s", res)
		}
	})
	t.Run("numgen with a missing index, goto and jump", func(t *testing.T) {
		res, err := ts.Trace(pkt("192.0.2.1", "10.96.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, o := range res.Outcomes {
			path := slices.DeleteFunc(slices.Clone(o.Path), func(c string) bool {
				return c == "early" || c == "late" || c == "sub" || c == "same-a"
			})
			got = append(got, o.Verdict+" "+o.Endpoint+" "+strings.Join(path, ",")+" "+formatProb(o.Probability))
		}
		want := []string{
			// 0: goto gone, which returns to nat1's caller: nat1 ends, nat2 DNATs; forward's policy drops.
			"DROP 10.0.0.99:1 nat1,pick,gone,nat2,fwd 0.25",
			// 1: jump gone returns into pick, whose next rules DNAT.
			// 2: no element: the vmap misses, the next rules DNAT.
			// 3: drop.
			"DROP  nat1,pick 0.25",
			"ACCEPT 10.0.0.8:8080 nat1,pick,gone,fwd,post 0.25",
			"ACCEPT 10.0.0.8:8080 nat1,pick,fwd,post 0.25",
		}
		slices.Sort(got)
		slices.Sort(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("(-want +got):\n%s\n%s", diff, res)
		}
	})
	t.Run("input path", func(t *testing.T) {
		p := udp(pkt("192.0.2.1", "192.168.0.2"))
		p.LocalAddrs = node4
		res, err := ts.Trace(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Outcomes) != 1 || res.Outcomes[0].Hook != "ip kube-proxy in" || res.Outcomes[0].Verdict != "ACCEPT" {
			t.Errorf("got %s", res)
		}
	})
	t.Run("no table for the family", func(t *testing.T) {
		res, err := ts.Trace(fromPod("fd00::1", "fd00::2", 80))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Outcomes) != 1 || res.Outcomes[0].Verdict != "ACCEPT" || res.Outcomes[0].Hook != "" || len(res.Outcomes[0].Path) != 0 {
			t.Errorf("got %s", res)
		}
	})
}

func formatProb(p float64) string { return strconv.FormatFloat(p, 'g', -1, 64) }

// TestTraceErrors covers what Load cannot catch: packets the tracer cannot walk, and state changed behind
// its back (a chain removed from the live Table, a loop made by editing rules).
func TestTraceErrors(t *testing.T) {
	ts := loadUpstream(t)
	for _, tc := range []struct {
		name    string
		pkt     Packet
		errPart string
	}{
		{"mixed families", Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("fd00::1"), Protocol: "tcp"}, "different families"},
		{"no source", Packet{Dst: netip.MustParseAddr("10.0.0.1"), Protocol: "tcp"}, "needs a source"},
		{"protocol", Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "gre"}, "unsupported protocol"},
	} {
		if _, err := ts.Trace(tc.pkt); err == nil || !strings.Contains(err.Error(), tc.errPart) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.errPart)
		}
	}

	missing := New()
	mustLoad(t, missing, semantics)
	delete(missing.Table("ip").Chains, "gone")
	if _, err := missing.Trace(fromOutside("192.0.2.1", "10.96.0.1", 80)); err == nil || !strings.Contains(err.Error(), "to missing chain gone") {
		t.Errorf("missing chain: error %v", err)
	}

	loop := New()
	mustLoad(t, loop, "add table ip kube-proxy\nadd chain ip kube-proxy b { type filter hook forward priority 0 ; }\nadd chain ip kube-proxy x\nadd rule ip kube-proxy b jump x\n")
	r, err := parseRule("ip", mustLex(t, "jump x"))
	if err != nil {
		t.Fatal(err)
	}
	x := loop.Table("ip").Chains["x"]
	x.Rules = append(x.Rules, r)
	if _, err := loop.Trace(fromPod("10.0.0.1", "10.0.0.2", 80)); err == nil || !strings.Contains(err.Error(), "a loop?") {
		t.Errorf("loop: error %v", err)
	}
}

func mustLex(t *testing.T, text string) []token {
	t.Helper()
	lines, err := lex(text)
	if err != nil || len(lines) != 1 {
		t.Fatalf("lex %q: %v", text, err)
	}
	return lines[0].toks
}
