package iptrace

import (
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ipvsRules is a small ruleset in the shape of IPVS mode's: set matches decide masquerading and filtering,
// IPVS does the load balancing.
const ipvsRules = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SVC - [0:0]
:MASQ - [0:0]
:POST - [0:0]
-A PREROUTING -j SVC
-A OUTPUT -j SVC
-A POSTROUTING -j POST
-A POST -m set --match-set LOOP dst,dst,src -j MASQUERADE
-A POST -m mark ! --mark 0x4000/0x4000 -j RETURN
-A POST -j MASQUERADE
-A MASQ -j MARK --or-mark 0x4000
-A SVC -m set --match-set CIP dst,dst ! -s 10.244.0.0/16 -j MASQ
-A SVC -m set --match-set EXT dst,dst -j MASQ
-A SVC -m set --match-set EXT dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT
-A SVC -m addrtype --dst-type LOCAL -p tcp -m set --match-set NP dst -j MASQ
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:FILT - [0:0]
:OUTFILT - [0:0]
:FW - [0:0]
-A INPUT -j FW
-A INPUT -j FILT
-A OUTPUT -j OUTFILT
-A FW -m set --match-set LBFW dst,dst -m set ! --match-set LBSRC dst,dst,src -j DROP
-A FILT -m set --match-set CIP dst,dst -j RETURN
-A FILT -m set --match-set LBFW dst,dst -j RETURN
-A FILT -m set --match-set NP dst -j RETURN
-A FILT -m conntrack --ctstate NEW -m set --match-set IPS dst -j REJECT
-A OUTFILT -s 203.0.113.7/32 -m ipvs --vaddr 203.0.113.7/32 --vproto 6 --vport 80 -j DROP
COMMIT
`

func ipvsTables(t *testing.T) *Tables {
	t.Helper()
	ts := New(false)
	for _, s := range []struct {
		name, typ string
		members   []string
	}{
		{"CIP", "hash:ip,port", []string{"10.96.0.1,tcp:80", "10.96.0.2,udp:53"}},
		{"EXT", "hash:ip,port", []string{"192.0.2.1,tcp:80"}},
		{"NP", "bitmap:port", []string{"30080"}},
		{"LOOP", "hash:ip,port,ip", []string{"10.244.1.5,tcp:8080,10.244.1.5"}},
		{"LBFW", "hash:ip,port", []string{"203.0.113.7,tcp:80"}},
		{"LBSRC", "hash:ip,port,net", []string{"203.0.113.7,tcp:80,198.51.100.0/24"}},
		{"IPS", "hash:ip", []string{"10.96.0.1", "10.96.0.2", "192.0.2.1", "203.0.113.7"}},
	} {
		if err := ts.SetIPSet(s.name, s.typ, s.members...); err != nil {
			t.Fatal(err)
		}
	}
	mustRestore(t, ts, ipvsRules, true)
	ap := netip.MustParseAddrPort
	for _, vs := range []VirtualServer{
		{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: "tcp", Persistent: true,
			Reals: []RealServer{{ap("10.244.1.5:8080"), 1}, {ap("10.244.2.6:8080"), 3}, {ap("10.244.3.7:8080"), 0}}},
		{Addr: netip.MustParseAddr("10.96.0.2"), Port: 53, Protocol: "udp"},
		{Addr: netip.MustParseAddr("192.0.2.1"), Port: 80, Protocol: "tcp", Reals: []RealServer{{ap("10.244.2.6:8080"), 1}}},
		{Addr: netip.MustParseAddr("192.168.0.1"), Port: 30080, Protocol: "tcp", Reals: []RealServer{{ap("10.244.2.6:8080"), 1}}},
		{Addr: netip.MustParseAddr("203.0.113.7"), Port: 80, Protocol: "tcp", Reals: []RealServer{{ap("10.244.2.6:8080"), 1}}},
	} {
		if err := ts.AddVirtualServer(vs); err != nil {
			t.Fatal(err)
		}
	}
	return ts
}

func TestTraceIPVS(t *testing.T) {
	ts := ipvsTables(t)
	// The node's addresses include the Service addresses, bound to the dummy link as IPVS mode does.
	local := []netip.Addr{netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2"),
		netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("203.0.113.7")}
	pod, outside := netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("198.51.100.9")
	type want struct {
		Endpoints []string
		Verdicts  []string
		Masq      bool
		Probs     map[string]float64
	}
	for _, tc := range []struct {
		name string
		pkt  Packet
		want want
	}{
		{"cluster IP from a pod: by weight, draining real server skipped",
			Packet{Src: pod, Dst: netip.MustParseAddr("10.96.0.1"), Protocol: "tcp", DPort: 80, InIface: "veth7"},
			want{[]string{"10.244.1.5:8080", "10.244.2.6:8080"}, []string{"ACCEPT"}, false, map[string]float64{"10.244.1.5:8080": 0.25, "10.244.2.6:8080": 0.75}}},
		{"cluster IP from outside the pod network: masqueraded",
			Packet{Src: outside, Dst: netip.MustParseAddr("10.96.0.1"), Protocol: "tcp", DPort: 80, InIface: "eth0"},
			want{[]string{"10.244.1.5:8080", "10.244.2.6:8080"}, []string{"ACCEPT"}, true, nil}},
		{"persistence template: the same real server",
			Packet{Src: pod, Dst: netip.MustParseAddr("10.96.0.1"), Protocol: "tcp", DPort: 80, InIface: "veth7",
				Persistence: map[string]netip.AddrPort{"tcp/10.96.0.1:80": netip.MustParseAddrPort("10.244.1.5:8080")}},
			want{[]string{"10.244.1.5:8080"}, []string{"ACCEPT"}, false, map[string]float64{"10.244.1.5:8080": 1}}},
		{"hairpin: the endpoint itself is masqueraded by the LOOP set",
			Packet{Src: netip.MustParseAddr("10.244.1.5"), Dst: netip.MustParseAddr("10.96.0.1"), Protocol: "tcp", DPort: 80, InIface: "veth5",
				Persistence: map[string]netip.AddrPort{"tcp/10.96.0.1:80": netip.MustParseAddrPort("10.244.1.5:8080")}},
			want{[]string{"10.244.1.5:8080"}, []string{"ACCEPT"}, true, nil}},
		{"virtual server without real servers: port unreachable",
			Packet{Src: pod, Dst: netip.MustParseAddr("10.96.0.2"), Protocol: "udp", DPort: 53, InIface: "veth7"},
			want{nil, []string{"REJECT"}, false, nil}},
		{"a port the Service address does not serve: rejected by the filter",
			Packet{Src: pod, Dst: netip.MustParseAddr("10.96.0.1"), Protocol: "tcp", DPort: 81, InIface: "veth7"},
			want{nil, []string{"REJECT"}, false, nil}},
		{"the node itself: IPVS after nat OUTPUT",
			Packet{Src: netip.MustParseAddr("192.168.0.1"), Dst: netip.MustParseAddr("192.0.2.1"), Protocol: "tcp", DPort: 80, Local: true},
			want{[]string{"10.244.2.6:8080"}, []string{"ACCEPT"}, true, nil}},
		{"node port",
			Packet{Src: outside, Dst: netip.MustParseAddr("192.168.0.1"), Protocol: "tcp", DPort: 30080, InIface: "eth0"},
			want{[]string{"10.244.2.6:8080"}, []string{"ACCEPT"}, true, nil}},
		{"source ranges: a listed source passes",
			Packet{Src: outside, Dst: netip.MustParseAddr("203.0.113.7"), Protocol: "tcp", DPort: 80, InIface: "eth0"},
			want{[]string{"10.244.2.6:8080"}, []string{"ACCEPT"}, false, nil}},
		{"source ranges: another source is dropped",
			Packet{Src: netip.MustParseAddr("192.0.2.99"), Dst: netip.MustParseAddr("203.0.113.7"), Protocol: "tcp", DPort: 80, InIface: "eth0"},
			want{nil, []string{"DROP"}, false, nil}},
		{"ipvs match: the node from the load balancer's address is dropped after IPVS",
			Packet{Src: netip.MustParseAddr("203.0.113.7"), Dst: netip.MustParseAddr("203.0.113.7"), Protocol: "tcp", DPort: 80, Local: true},
			want{nil, []string{"DROP"}, false, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.pkt.LocalAddrs = local
			res, err := ts.Trace(tc.pkt)
			if err != nil {
				t.Fatal(err)
			}
			got := want{Endpoints: res.Endpoints(), Verdicts: res.Verdicts()}
			var ok bool
			if got.Masq, ok = res.Masquerade(); !ok {
				t.Errorf("mixed masquerade:\n%s", res)
			}
			if tc.want.Probs != nil {
				got.Probs = map[string]float64{}
				for _, o := range res.Outcomes {
					got.Probs[o.Endpoint] += o.Probability
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
				t.Errorf("(-want +got):\n%s\n%s", diff, res)
			}
		})
	}
}

// TestSetAndIPVSRulesSave: the new matches print as iptables-save prints them, so a live iptables-save
// round-trips.
func TestSetAndIPVSRulesSave(t *testing.T) {
	ts := ipvsTables(t)
	saved := ts.SaveAll()
	for _, want := range []string{
		"-A FW -m set --match-set LBFW dst,dst -m set ! --match-set LBSRC dst,dst,src -j DROP",
		"-A SVC -m set --match-set EXT dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT",
		"-A OUTFILT -s 203.0.113.7/32 -m ipvs --vproto 6 --vaddr 203.0.113.7/32 --vport 80 -j DROP",
	} {
		if !strings.Contains(saved, want+"\n") {
			t.Errorf("iptables-save lacks %q:\n%s", want, saved)
		}
	}
	again := New(false)
	again.sets = ts.sets // the same sets, so that the saved rules restore
	mustRestore(t, again, saved, false)
	if got := again.SaveAll(); got != saved {
		t.Errorf("save does not round-trip:\n%s", cmp.Diff(saved, got))
	}
}

// TestSetAndIPVSErrors: what the kernel refuses, and what the tracer cannot evaluate, are errors.
func TestSetAndIPVSErrors(t *testing.T) {
	ts := New(false)
	if err := ts.SetIPSet("S", "hash:ip,port", "10.0.0.1,tcp:80"); err != nil {
		t.Fatal(err)
	}
	if err := ts.SetIPSet("B", "bitmap:port", "80"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ what, payload string }{
		{"missing set", "*filter\n-A INPUT -m set --match-set NOPE dst -j DROP\nCOMMIT\n"},
		{"too many dimensions", "*filter\n-A INPUT -m set --match-set B dst,dst -j DROP\nCOMMIT\n"},
		{"bad direction", "*filter\n-A INPUT -m set --match-set S dst,both -j DROP\nCOMMIT\n"},
		{"other physdev options", "*filter\n-A INPUT -m physdev --physdev-in eth0 -j DROP\nCOMMIT\n"},
		{"bare ipvs", "*filter\n-A INPUT -m ipvs --ipvs -j DROP\nCOMMIT\n"},
	} {
		if err := ts.Clone().Restore([]byte(tc.payload), RestoreOptions{NoFlush: true}); err == nil {
			t.Errorf("%s: restore succeeded", tc.what)
		}
	}
	for _, tc := range []struct{ name, typ, member string }{
		{"X", "hash:net", "10.0.0.0/8"},
		{"X", "hash:ip,port", "10.0.0.1"},
		{"X", "hash:ip", "fd00::1"},
		{"X", "hash:ip,port", "10.0.0.1,icmp:0"},
	} {
		if err := ts.SetIPSet(tc.name, tc.typ, tc.member); err == nil {
			t.Errorf("SetIPSet(%s, %q) succeeded", tc.typ, tc.member)
		}
	}
	if err := ts.AddVirtualServer(VirtualServer{Addr: netip.MustParseAddr("fd00::1"), Port: 80, Protocol: "tcp"}); err == nil {
		t.Error("AddVirtualServer of the other family succeeded")
	}
	// A match on fewer dimensions than the set has is accepted by the kernel but not evaluated here.
	mustRestore(t, ts, "*filter\n-A INPUT -m set --match-set S dst -j DROP\nCOMMIT\n", true)
	if _, err := ts.Trace(Packet{Src: netip.MustParseAddr("10.0.0.9"), Dst: netip.MustParseAddr("10.0.0.1"), Protocol: "tcp", DPort: 80,
		InIface: "eth0", LocalAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}); err == nil {
		t.Error("a set match on fewer dimensions than the set was traced")
	}
}
