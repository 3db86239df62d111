package iptrace

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"kube-proxy/rules/internal/netnstest"
	"kube-proxy/rules/nfacct"
)

// nfacctRules carries upstream's two nfacct rule shapes: a localhost NodePort counted before it jumps on,
// and the DROP of INVALID packets counted.
const nfacctRules = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-EXT - [0:0]
-A OUTPUT -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns/web:http -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT
-A KUBE-NODEPORTS -m comment --comment ns/web:http -m tcp -p tcp --dport 30080 -j KUBE-EXT
-A KUBE-EXT -p tcp -j DNAT --to-destination 10.244.1.5:8080
COMMIT
*filter
:FORWARD ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
COMMIT
`

// nfacctSaved is what iptables-nft-save 1.8.9 prints for nfacctRules (TestNFAcctAgainstKernel checks it):
// note the two spaces after --nfacct-name.
var nfacctSaved = map[string]string{
	"nat": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-EXT - [0:0]
:KUBE-NODEPORTS - [0:0]
-A OUTPUT -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXT -p tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "ns/web:http" -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns/web:http" -m tcp --dport 30080 -j KUBE-EXT
COMMIT
`,
	"filter": `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP
COMMIT
`,
}

var nfacctCounters = []string{"localhost_nps_accepted_pkts", "ct_state_invalid_dropped_pkts"}

func TestNFAcct(t *testing.T) {
	ts := New(false)
	ts.SetCounters(nfacctCounters...)
	mustRestore(t, ts, nfacctRules, true)
	for table, want := range nfacctSaved {
		if diff := cmp.Diff(want, ts.Save(table)); diff != "" {
			t.Errorf("Save(%s) differs from iptables-save (-want +got):\n%s", table, diff)
		}
	}
	// The saved form reads back to the same rules.
	back := New(false)
	mustRestore(t, back, nfacctSaved["nat"]+nfacctSaved["filter"], false)
	if diff := cmp.Diff(ts.SaveAll(), back.SaveAll()); diff != "" {
		t.Errorf("saved rules do not restore to themselves (-first +again):\n%s", diff)
	}

	// The counting rule only counts: the packet goes on to its target.
	res, err := ts.Trace(Packet{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.1"),
		Protocol: "tcp", DPort: 30080, Local: true, LocalAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Endpoints(); !cmp.Equal(got, []string{"10.244.1.5:8080"}) {
		t.Errorf("localhost NodePort reaches %v, want 10.244.1.5:8080:\n%s", got, res)
	}
	want := []string{
		"nat/OUTPUT: -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
		`nat/KUBE-NODEPORTS: -d 127.0.0.0/8 -p tcp -m comment --comment "ns/web:http" -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT`,
		"nat/KUBE-EXT: -p tcp -j DNAT --to-destination 10.244.1.5:8080",
	}
	if len(res.Outcomes) != 1 || !cmp.Equal(res.Outcomes[0].Rules, want) {
		t.Errorf("rules that acted:\n%s\nwant:\n%s", res, strings.Join(want, "\n"))
	}
}

// nfacctErrors are refused by iptables as by the tracer, given the counters of nfacctCounters.
var nfacctErrors = []struct {
	name, rule, errPart string
}{
	{"missing counter", "-A KUBE-C -m nfacct --nfacct-name no_such_counter -j DROP", "No such file or directory"},
	{"no name", "-A KUBE-C -m nfacct -j DROP", "--nfacct-name required"},
	{"inverted", "-A KUBE-C -m nfacct ! --nfacct-name ct_state_invalid_dropped_pkts -j DROP", `"!" not allowed`},
	{"name too long", "-A KUBE-C -m nfacct --nfacct-name " + strings.Repeat("x", 32) + " -j DROP", "1 to 31 characters"},
}

func TestNFAcctErrors(t *testing.T) {
	for _, tc := range nfacctErrors {
		t.Run(tc.name, func(t *testing.T) {
			ts := New(false)
			ts.SetCounters(nfacctCounters...)
			err := ts.Restore([]byte("*filter\n:KUBE-C - [0:0]\n"+tc.rule+"\nCOMMIT\n"), RestoreOptions{NoFlush: true})
			if err == nil || !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("restore: %v, want an error containing %q", err, tc.errPart)
			}
		})
	}
	// Without SetCounters (rules read back from a kernel), any name is taken; with none set, none is.
	if err := New(false).Restore([]byte("*filter\n:KUBE-C - [0:0]\n-A KUBE-C -m nfacct --nfacct-name any -j DROP\nCOMMIT\n"), RestoreOptions{NoFlush: true}); err != nil {
		t.Errorf("restore without modelled counters: %v", err)
	}
	none := New(false)
	none.SetCounters()
	if err := none.Restore([]byte("*filter\n:KUBE-C - [0:0]\n-A KUBE-C -m nfacct --nfacct-name any -j DROP\nCOMMIT\n"), RestoreOptions{NoFlush: true}); err == nil {
		t.Errorf("restore naming a counter where none exists succeeded")
	}
}

// TestNFAcctAgainstKernel creates the counters in a fresh namespace, loads nfacctRules with both backends
// and compares iptables-save with Save, then checks that the kernel refuses what the tracer refuses.
func TestNFAcctAgainstKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		t.Run(backend, func(t *testing.T) {
			ns := netnstest.New(t)
			netnstest.Check(t, backend, false)
			acct, err := nfacct.New(int(ns.File(t).Fd()))
			if err != nil {
				t.Fatal(err)
			}
			defer acct.Close()
			ts := New(false)
			for _, c := range nfacctCounters {
				if err := acct.Ensure(c); err != nil {
					t.Fatal(err)
				}
			}
			ts.SetCounters(nfacctCounters...)
			if err := ns.Restore(backend, false, []byte(nfacctRules), "--noflush"); err != nil {
				t.Fatal(err)
			}
			mustRestore(t, ts, nfacctRules, true)
			checkAgainstKernel(t, ns, backend, ts)
			for _, tc := range nfacctErrors {
				if err := ns.Restore(backend, false, []byte("*filter\n:KUBE-C - [0:0]\n"+tc.rule+"\nCOMMIT\n"), "--noflush"); err == nil {
					t.Errorf("%s: the kernel took %s", tc.name, tc.rule)
				}
			}
		})
	}
}
