package iptrace

import (
	"math"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const traceRules = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SVC - [0:0]
:SEP1 - [0:0]
:SEP2 - [0:0]
:SEP3 - [0:0]
:MASQ - [0:0]
:POST - [0:0]
:GOTO - [0:0]
-A PREROUTING -j SVC
-A OUTPUT -j SVC
-A POSTROUTING -j POST
-A POST -m mark ! --mark 0x4000/0x4000 -j RETURN
-A POST -j MARK --xor-mark 0x4000
-A POST -j MASQUERADE --random-fully
-A MASQ -j MARK --or-mark 0x4000
-A SVC -d 10.0.0.10 -p tcp -m tcp --dport 80 ! -s 10.244.0.0/16 -j MASQ
-A SVC -d 10.0.0.10 -p tcp -m tcp --dport 80 -m recent --name SEP3 --rcheck --seconds 60 --reap -j SEP3
-A SVC -d 10.0.0.10 -p tcp -m tcp --dport 80 -m statistic --mode random --probability 0.3333333333 -j SEP1
-A SVC -d 10.0.0.10 -p tcp -m tcp --dport 80 -m statistic --mode random --probability 0.5000000000 -j SEP2
-A SVC -d 10.0.0.10 -p tcp -m tcp --dport 80 -j SEP3
-A SVC -d 10.0.0.11 -g GOTO
-A SVC -d 10.0.0.11 -j DNAT --to-destination 9.9.9.9:1
-A GOTO -p udp -j RETURN
-A GOTO -j DNAT --to-destination 10.244.1.1
-A SEP1 -j DNAT --to-destination 10.244.1.1:8080
-A SEP2 -j DNAT --to-destination 10.244.1.2:8080
-A SEP3 -m recent --name SEP3 --set -p tcp -m tcp -j DNAT --to-destination 10.244.1.3:8080
COMMIT
*filter
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FW - [0:0]
-A FORWARD -m conntrack --ctstate NEW -j FW
-A FW -d 10.0.0.12 -j REJECT
-A FW -m conntrack --ctstate DNAT -d 10.244.1.1 -p udp -j DROP
-A INPUT -i eth+ -d 127.0.0.0/8 -j DROP
COMMIT
`

func TestTrace(t *testing.T) {
	ts := New(false)
	mustRestore(t, ts, traceRules, true)
	node := []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	type want struct {
		endpoints []string
		verdicts  []string
		masq      bool
		recent    []string
	}
	for _, tc := range []struct {
		name string
		pkt  Packet
		want want
	}{
		{"spread, masqueraded from outside the pod CIDR",
			Packet{Src: netip.MustParseAddr("192.168.0.9"), Dst: netip.MustParseAddr("10.0.0.10"), Protocol: "tcp", DPort: 80, InIface: "eth0", LocalAddrs: node},
			want{[]string{"10.244.1.1:8080", "10.244.1.2:8080", "10.244.1.3:8080"}, []string{"ACCEPT"}, true, []string{"SEP3"}}},
		{"spread, not masqueraded from a pod",
			Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.10"), Protocol: "tcp", DPort: 80, InIface: "cbr0", LocalAddrs: node},
			want{[]string{"10.244.1.1:8080", "10.244.1.2:8080", "10.244.1.3:8080"}, []string{"ACCEPT"}, false, []string{"SEP3"}}},
		{"affinity",
			Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.10"), Protocol: "tcp", DPort: 80, Local: true, LocalAddrs: node, Recent: []string{"SEP3"}},
			want{[]string{"10.244.1.3:8080"}, []string{"ACCEPT"}, false, []string{"SEP3"}}},
		{"wrong port passes untouched",
			Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.10"), Protocol: "tcp", DPort: 81, InIface: "cbr0", LocalAddrs: node},
			want{nil, []string{"ACCEPT"}, false, nil}},
		{"goto returns to the caller's caller",
			Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.11"), Protocol: "udp", DPort: 53, InIface: "cbr0", LocalAddrs: node},
			want{nil, []string{"ACCEPT"}, false, nil}},
		{"goto DNAT keeps the port, then DNAT state drops it",
			Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.11"), Protocol: "tcp", DPort: 53, InIface: "cbr0", LocalAddrs: node},
			want{[]string{"10.244.1.1"}, []string{"ACCEPT"}, false, nil}},
		{"reject in filter FORWARD",
			Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.12"), Protocol: "tcp", DPort: 53, InIface: "cbr0", LocalAddrs: node},
			want{nil, []string{"REJECT"}, false, nil}},
		{"local destination goes to INPUT",
			Packet{Src: netip.MustParseAddr("192.168.0.9"), Dst: netip.MustParseAddr("127.0.0.1"), Protocol: "tcp", DPort: 53, InIface: "eth0", LocalAddrs: node},
			want{nil, []string{"DROP"}, false, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ts.Trace(tc.pkt)
			if err != nil {
				t.Fatal(err)
			}
			got := want{endpoints: res.Endpoints(), verdicts: res.Verdicts()}
			var ok bool
			got.masq, ok = res.Masquerade()
			if !ok {
				t.Errorf("mixed masquerade:\n%s", res)
			}
			for _, o := range res.Outcomes {
				got.recent = append(got.recent, o.Remembered...)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s\n%s", diff, res)
			}
			sum := 0.0
			for _, o := range res.Outcomes {
				sum += o.Probability
			}
			if math.Abs(sum-1) > 1e-6 {
				t.Errorf("probabilities sum to %v:\n%s", sum, res)
			}
		})
	}
}

func TestTraceSpreadIsEven(t *testing.T) {
	ts := New(false)
	mustRestore(t, ts, traceRules, true)
	res, err := ts.Trace(Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.10"), Protocol: "tcp", DPort: 80, InIface: "cbr0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outcomes) != 3 {
		t.Fatalf("want 3 outcomes:\n%s", res)
	}
	for _, o := range res.Outcomes {
		if math.Abs(o.Probability-1.0/3) > 1e-6 {
			t.Errorf("%s reached with probability %v, want 1/3", o.Endpoint, o.Probability)
		}
	}
}

func TestTraceListsTheRulesThatActed(t *testing.T) {
	ts := New(false)
	mustRestore(t, ts, traceRules, true)
	node := []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	res, err := ts.Trace(Packet{Src: netip.MustParseAddr("10.244.0.5"), Dst: netip.MustParseAddr("10.0.0.12"), Protocol: "tcp", DPort: 53, InIface: "cbr0", LocalAddrs: node})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outcomes) != 1 {
		t.Fatalf("want one outcome:\n%s", res)
	}
	want := []string{
		"nat/PREROUTING: -j SVC",
		"filter/FORWARD: -m conntrack --ctstate NEW -j FW",
		"filter/FW: -d 10.0.0.12/32 -j REJECT --reject-with icmp-port-unreachable",
	}
	if diff := cmp.Diff(want, res.Outcomes[0].Rules); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestTraceRedirect(t *testing.T) {
	ts := New(false)
	mustRestore(t, ts, `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-PORTALS - [0:0]
-A PREROUTING -j KUBE-PORTALS
-A OUTPUT -j KUBE-PORTALS
-A KUBE-PORTALS -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 41000
COMMIT
`, true)
	node := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.0.1")}
	for _, tc := range []struct {
		local bool
		want  string
	}{{false, "192.168.0.1:41000"}, {true, "127.0.0.1:41000"}} {
		pkt := Packet{Src: netip.MustParseAddr("192.168.0.9"), Dst: netip.MustParseAddr("10.0.0.10"), Protocol: "tcp", DPort: 80, InIface: "eth0", LocalAddrs: node}
		pkt.Dst = netip.MustParseAddr("10.96.0.10")
		pkt.Local = tc.local
		res, err := ts.Trace(pkt)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Endpoints(); len(got) != 1 || got[0] != tc.want || res.Outcomes[0].Hook != "nat/INPUT" && !tc.local {
			t.Errorf("local=%v: %s, want %s delivered locally", tc.local, res, tc.want)
		}
	}
	if _, err := ParseRule([]string{"-j", "REDIRECT", "--to-ports", "80"}, false); err == nil {
		t.Error("REDIRECT --to-ports without a protocol was accepted")
	}
}
