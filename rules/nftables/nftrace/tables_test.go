package nftrace

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustLoad(t testing.TB, ts *Tables, texts ...string) {
	t.Helper()
	for _, text := range texts {
		if err := ts.Load(text); err != nil {
			t.Fatalf("load: %v", err)
		}
	}
}

// formatPairs are transactions (testdata/*.nft, replayed in order) and what `nft list` printed after a real
// kernel applied them (testdata/*.list; TestKernelListings captures them again, -update rewrites them).
var formatPairs = []struct {
	name         string
	transactions []string
	listing      string
	foreign      []string
}{
	{"ipv4", []string{"upstream4.nft"}, "upstream4.list", nil},
	{"ipv6", []string{"upstream6.nft"}, "upstream6.list", nil},
	{"ipv4 after a partial sync", []string{"upstream4.nft", "update4.nft", "foreign.nft"}, "update4-ruleset.list", []string{"inet other-fw", "ip nat"}},
}

func loadPair(t *testing.T, transactions []string, listing string) (fromTx, fromList *Tables) {
	t.Helper()
	fromTx, fromList = New(), New()
	for _, f := range transactions {
		mustLoad(t, fromTx, readFile(t, f))
	}
	mustLoad(t, fromList, readFile(t, listing))
	return fromTx, fromList
}

// TestFormatsAgree parses the transactions and nft's listing of the same state and checks they give the
// same model and the same traces.
func TestFormatsAgree(t *testing.T) {
	for _, p := range formatPairs {
		t.Run(p.name, func(t *testing.T) {
			a, b := loadPair(t, p.transactions, p.listing)
			checkRefCounts(t, a)
			if diff := cmp.Diff(a.Dump(), b.Dump()); diff != "" {
				t.Errorf("transaction and listing differ (-transaction +listing):\n%s", diff)
			}
			if diff := cmp.Diff(p.foreign, b.Foreign()); diff != "" {
				t.Errorf("foreign tables in the listing (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(p.foreign, a.Foreign()); diff != "" {
				t.Errorf("foreign tables in the transactions (-want +got):\n%s", diff)
			}
			for _, fam := range a.Families() {
				if diff := cmp.Diff(a.Chains(fam), b.Chains(fam)); diff != "" {
					t.Errorf("chains differ:\n%s", diff)
				}
				for _, c := range a.Chains(fam) {
					if diff := cmp.Diff(a.Rules(fam, c), b.Rules(fam, c)); diff != "" {
						t.Errorf("chain %s differs:\n%s", c, diff)
					}
				}
				for _, s := range a.Sets(fam) {
					if diff := cmp.Diff(a.Elements(fam, s), b.Elements(fam, s)); diff != "" {
						t.Errorf("set %s differs:\n%s", s, diff)
					}
				}
			}
			n := 0
			for _, tc := range traceCases {
				ra, errA := a.Trace(tc.pkt)
				rb, errB := b.Trace(tc.pkt)
				if errA != nil || errB != nil {
					t.Fatalf("%s: %v / %v", tc.name, errA, errB)
				}
				if diff := cmp.Diff(ra, rb, addrPortEqual); diff != "" {
					t.Errorf("%s: traces differ (-transaction +listing):\n%s", tc.name, diff)
				}
				n++
			}
			if n == 0 {
				t.Fatal("no trace cases")
			}
		})
	}
}

func TestDumpLoadsBack(t *testing.T) {
	for _, p := range formatPairs {
		a, _ := loadPair(t, p.transactions, p.listing)
		b := New()
		mustLoad(t, b, a.Dump())
		if diff := cmp.Diff(a.Dump(), b.Dump()); diff != "" {
			t.Errorf("%s: the dump loads back differently:\n%s", p.name, diff)
		}
	}
}

func TestAccessors(t *testing.T) {
	ts := New()
	mustLoad(t, ts, readFile(t, "upstream4.nft"), readFile(t, "upstream6.nft"))
	if diff := cmp.Diff([]string{"ip", "ip6"}, ts.Families()); diff != "" {
		t.Error(diff)
	}
	for hook, want := range map[string][]string{
		"prerouting":  {"filter-prerouting-pre-dnat", "nat-prerouting"},
		"output":      {"filter-output-pre-dnat", "nat-output", "filter-output"},
		"input":       {"filter-input"},
		"forward":     {"filter-forward"},
		"postrouting": {"nat-postrouting"},
	} {
		if diff := cmp.Diff(want, ts.BaseChains("ip", hook)); diff != "" {
			t.Errorf("%s: %s", hook, diff)
		}
	}
	if diff := cmp.Diff([]string{
		`meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.1 . 80, 1 : 10.180.2.1 . 80 }`,
	}, ts.Rules("ip", "service-K2XW3MQA-ns1/svc1/tcp/p80")); diff != "" {
		t.Error(diff)
	}
	if diff := cmp.Diff([]string{
		`5.6.7.8 . tcp . 80 comment "ns2/svc2:p80" : drop`,
		`172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain`,
		`192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop`,
	}, ts.Elements("ip", "no-endpoint-services")); diff != "" {
		t.Error(diff)
	}
	if ts.Rules("ip", "nope") != nil || ts.Elements("ip6", "nope") != nil || ts.Chains("inet") != nil {
		t.Error("missing objects should give nil")
	}
	tb := ts.Table("ip6")
	if tb == nil || tb.Chains["nat-prerouting"].Priority != -100 || tb.Chains["nat-prerouting"].Type != "nat" ||
		tb.Sets["service-ips"].KeyType[2] != "inet_service" || !tb.Sets["service-ips"].Map {
		t.Errorf("Table(ip6) = %+v", tb)
	}
	c := ts.Clone()
	mustLoad(t, c, "flush ruleset\n")
	if len(c.Families()) != 0 || len(ts.Families()) != 2 {
		t.Error("Clone is not independent")
	}
}

// TestReplay applies transactions one after the other, as kube-proxy's syncs do, and checks the state
// after each, or the error (which must leave the state as it was).
func TestReplay(t *testing.T) {
	ts := New()
	steps := []struct {
		name    string
		tx      string
		errPart string
		check   func(t *testing.T)
	}{
		{name: "create", tx: `add table ip kube-proxy { comment "rules for kube-proxy" ; }
add chain ip kube-proxy c
add chain ip kube-proxy d
add chain ip kube-proxy base { type filter hook input priority filter ; }
add set ip kube-proxy s { type ipv4_addr ; }
add map ip kube-proxy m { type inet_proto . inet_service : verdict ; }
add rule ip kube-proxy c ip daddr @s accept
add rule ip kube-proxy base jump c
add element ip kube-proxy s { 10.0.0.1, 10.0.0.2 }
add element ip kube-proxy m { tcp . 80 : goto d, udp . 53 : drop }
`, check: func(t *testing.T) {
			if got := ts.Elements("ip", "s"); len(got) != 2 {
				t.Errorf("elements %q", got)
			}
		}},
		{name: "insert puts the rule first", tx: "insert rule ip kube-proxy c drop\n", check: func(t *testing.T) {
			if diff := cmp.Diff([]string{"drop", "ip daddr @s accept"}, ts.Rules("ip", "c")); diff != "" {
				t.Error(diff)
			}
		}},
		{name: "add existing element, same value", tx: "add element ip kube-proxy m { tcp . 80 : goto d }\n"},
		{name: "add existing element, other value", tx: "add element ip kube-proxy m { tcp . 80 : drop }\n", errPart: "exists (File exists)"},
		{name: "create existing element", tx: "create element ip kube-proxy s { 10.0.0.1 }\n", errPart: "exists"},
		{name: "delete missing element", tx: "delete element ip kube-proxy s { 10.0.0.9 }\n", errPart: "does not exist"},
		{name: "destroy missing element", tx: "destroy element ip kube-proxy s { 10.0.0.9 }\n"},
		{name: "delete referenced chain", tx: "delete chain ip kube-proxy d\n", errPart: "in use by an element of map m"},
		{name: "delete chain used by a rule", tx: "delete chain ip kube-proxy c\n", errPart: "in use by a rule of chain base"},
		{name: "delete referenced set", tx: "delete set ip kube-proxy s\n", errPart: "in use by a rule of chain c"},
		{name: "change a base chain", tx: "add chain ip kube-proxy base { type filter hook input priority 10 ; }\n", errPart: "Operation not supported"},
		{name: "re-add a base chain as it is", tx: "add chain ip kube-proxy base { type filter hook input priority 0 ; }\nadd chain ip kube-proxy base\n"},
		{name: "set type change", tx: "add set ip kube-proxy s { type inet_service ; }\n", errPart: "another type"},
		{name: "flush table keeps set elements", tx: "flush table ip kube-proxy\n", check: func(t *testing.T) {
			if len(ts.Rules("ip", "c")) != 0 || len(ts.Elements("ip", "s")) != 2 {
				t.Errorf("rules %q, elements %q", ts.Rules("ip", "c"), ts.Elements("ip", "s"))
			}
		}},
		{name: "a failing transaction changes nothing", tx: "add rule ip kube-proxy c accept\ndelete chain ip kube-proxy nope\n", errPart: "line 2: chain nope does not exist", check: func(t *testing.T) {
			if len(ts.Rules("ip", "c")) != 0 {
				t.Error("the first line of a failed transaction was applied")
			}
		}},
		{name: "delete map element, then the chain", tx: "delete element ip kube-proxy m { tcp . 80 }\ndelete chain ip kube-proxy d\nflush set ip kube-proxy s\n", check: func(t *testing.T) {
			if slices.Contains(ts.Chains("ip"), "d") || len(ts.Elements("ip", "s")) != 0 {
				t.Error("not deleted")
			}
		}},
		{name: "destroy missing chain", tx: "destroy chain ip kube-proxy d\ndestroy set ip kube-proxy nope\n"},
		{name: "delete table", tx: "delete table ip kube-proxy\n", check: func(t *testing.T) {
			if ts.Table("ip") != nil {
				t.Error("table still there")
			}
		}},
		{name: "command on a missing table", tx: "add chain ip kube-proxy c\n", errPart: "table ip kube-proxy does not exist"},
		{name: "create twice", tx: "create table ip kube-proxy\ncreate table ip kube-proxy\n", errPart: "line 2: table ip kube-proxy exists"},
	}
	for _, s := range steps {
		before := ts.Dump()
		err := ts.Load(s.tx)
		switch {
		case s.errPart == "" && err != nil:
			t.Fatalf("%s: %v", s.name, err)
		case s.errPart != "" && err == nil:
			t.Fatalf("%s: no error, want one containing %q", s.name, s.errPart)
		case err != nil && !strings.Contains(err.Error(), s.errPart):
			t.Fatalf("%s: error %q does not contain %q", s.name, err, s.errPart)
		case err != nil && ts.Dump() != before:
			t.Fatalf("%s: a failed load changed the state", s.name)
		}
		if s.check != nil {
			t.Run(s.name, s.check)
		}
		checkRefCounts(t, ts)
	}
}

// checkRefCounts compares the reference counts kept up to date by every command with counts made afresh.
func checkRefCounts(t *testing.T, ts *Tables) {
	t.Helper()
	for _, fam := range ts.Families() {
		tb := ts.Table(fam)
		fresh := tb.clone()
		fresh.recount()
		nonZero := func(m map[string]int) map[string]int {
			out := map[string]int{}
			for k, v := range m {
				if v != 0 {
					out[k] = v
				}
			}
			return out
		}
		if diff := cmp.Diff(nonZero(fresh.refs), nonZero(tb.refs)); diff != "" {
			t.Errorf("%s: reference counts (-fresh +kept):\n%s", fam, diff)
		}
	}
}

// TestLoadErrors checks that what the kernel or nft would refuse is refused, naming the cause.
func TestLoadErrors(t *testing.T) {
	const head = "add table ip kube-proxy\nadd chain ip kube-proxy a\nadd chain ip kube-proxy b\n" +
		"add chain ip kube-proxy pre { type filter hook prerouting priority dstnat - 10 ; }\n" +
		"add chain ip kube-proxy post { type nat hook postrouting priority srcnat ; }\n" +
		"add set ip kube-proxy ips { type ipv4_addr ; }\n" +
		"add map ip kube-proxy vm { type ipv4_addr . inet_proto . inet_service : verdict ; }\n"
	for _, tc := range []struct {
		name, tx, errPart string
	}{
		{"unknown statement", "add rule ip kube-proxy a queue num 1\n", "line 1: chain a: unexpected token queue"},
		{"jump to a missing chain", "add rule ip kube-proxy a jump nope\n", "jump or goto to missing chain nope"},
		{"map element to a missing chain", "add element ip kube-proxy vm { 10.0.0.1 . tcp . 80 : goto nope }\n", "goto to missing chain nope"},
		{"loop", "add rule ip kube-proxy a jump b\nadd rule ip kube-proxy b goto a\n", "chain loop a -> b -> a"},
		{"loop through a map", "add rule ip kube-proxy a ip daddr . meta l4proto . th dport vmap @vm\nadd element ip kube-proxy vm { 10.0.0.1 . tcp . 80 : jump a }\n", "chain loop a -> a"},
		{"missing set", "add rule ip kube-proxy a ip daddr @nope accept\n", "missing set or map nope"},
		{"key type mismatch", "add rule ip kube-proxy a ip daddr . th dport vmap @vm\n", "key ip daddr . th dport (ipv4_addr . inet_service) does not match map vm"},
		{"lookup in a map", "add rule ip kube-proxy a ip daddr . meta l4proto . th dport @vm accept\n", "lookup in vm, which is a map"},
		{"vmap on a set", "add rule ip kube-proxy a ip daddr vmap @ips\n", "vmap on ips, which is a set"},
		{"missing counter", "add rule ip kube-proxy a counter name \"c\" drop\n", "missing counter c"},
		{"masquerade reached from prerouting", "add rule ip kube-proxy pre jump a\nadd rule ip kube-proxy a masquerade\n", "reached from base chain pre (type filter hook prerouting): masquerade needs a nat chain on the postrouting hook"},
		{"dnat in postrouting", "add rule ip kube-proxy post meta l4proto tcp dnat to 10.0.0.1:80\n", "dnat needs a nat chain on the prerouting or output hook"},
		{"reject in postrouting", "add rule ip kube-proxy post reject\n", "reject is not allowed on the postrouting hook"},
		{"colon in a chain name", "add chain ip kube-proxy endpoint-X__fd00::1/80\n", "not an nft identifier"},
		{"prefix in a plain set", "add element ip kube-proxy ips { 10.0.0.0/8 }\n", "needs an interval set"},
		{"ipv6 element in an ipv4 set", "add element ip kube-proxy ips { fd00::1 }\n", "bad ipv4_addr"},
		{"element key too short", "add element ip kube-proxy vm { 10.0.0.1 . tcp : drop }\n", `expected "."`},
		{"element comment after the value (nft 1.0.6 refuses it)", "add element ip kube-proxy vm { 10.0.0.1 . tcp . 80 : drop comment \"x\" }\n", `unexpected token comment, expected ","`},
		{"map element without value", "add element ip kube-proxy vm { 10.0.0.1 . tcp . 80 }\n", `expected ":"`},
		{"non-verdict map", "add map ip kube-proxy m2 { type ipv4_addr : ipv4_addr ; }\n", "only verdict maps are supported"},
		{"unsupported set type", "add set ip kube-proxy s2 { type ether_addr ; }\n", "expected a supported key type"},
		{"rule handles", "add rule ip kube-proxy a handle 4 accept\n", "rule positions are not supported"},
		{"replace", "replace rule ip kube-proxy a handle 4 accept\n", "replace rule is not supported"},
		{"delete rule", "delete rule ip kube-proxy a handle 4\n", "delete rule is not supported"},
		{"unknown command", "list table ip kube-proxy\n", "unexpected token list"},
		{"unknown object", "add flowtable ip kube-proxy f\n", "unexpected token flowtable"},
		{"unterminated string", "add rule ip kube-proxy a accept comment \"x\n", "unterminated string"},
		{"unbalanced braces", "add element ip kube-proxy ips { 10.0.0.1\n", "unbalanced braces"},
		{"policy on a regular chain", "add chain ip kube-proxy c { policy drop ; }\n", "a policy needs a base chain"},
		{"bad priority", "add chain ip kube-proxy c { type filter hook input priority high ; }\n", "unexpected token high, expected a priority"},
		{"bad hook", "add chain ip kube-proxy c { type filter hook ingress priority 0 ; }\n", "unexpected token ingress"},
	} {
		ts := New()
		mustLoad(t, ts, head)
		before := ts.Dump()
		err := ts.Load(tc.tx)
		if err == nil {
			t.Errorf("%s: no error, want one containing %q", tc.name, tc.errPart)
			continue
		}
		if !strings.Contains(err.Error(), tc.errPart) {
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.errPart)
		}
		if ts.Dump() != before {
			t.Errorf("%s: a failed load changed the state", tc.name)
		}
	}
}

// TestListingVariants covers what `nft list` may print besides the samples: handles (nft -a), chain
// comments, named priorities with offsets, drop policies, counters, dynamic set elements with expiry,
// elements over several lines, and other tables to skip.
func TestListingVariants(t *testing.T) {
	const listing = `table inet filter { # handle 3
	set allowed { # handle 2
		type ipv4_addr
		elements = { 10.0.0.1 }
	}
	flowtable ft { # handle 4
		hook ingress priority filter; devices = { lo };
	}
	chain input { # handle 1
		type filter hook input priority filter; policy drop;
		ip saddr { 10.0.0.1,
			   10.0.0.2 } accept # handle 5
		meter m { ip saddr limit rate 10/second } accept
	}
}
table ip kube-proxy { # handle 7
	comment "rules for kube-proxy"
	counter localhost-nodeport-rejected-tcp { # handle 9
		packets 12 bytes 720
	}

	set affinity-X { # handle 3
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
		elements = { 10.0.0.5 timeout 3h expires 2h59m59s992ms, 10.0.0.6 expires 1d2h }
	}

	map vm { # handle 4
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.0.0.1 . tcp . 80 comment "a, b : c" : goto svc,
			     10.0.0.2 . udp . 53 : drop }
	}

	chain pre { # handle 1
		comment "the first base chain"
		type filter hook prerouting priority dstnat - 10; policy drop;
		ip daddr . meta l4proto . th dport vmap @vm # handle 10
	}

	chain late { # handle 2
		type filter hook forward priority filter + 5; policy accept;
		counter packets 3 bytes 180 accept # handle 11
	}

	chain svc { # handle 5
		ip saddr @affinity-X counter name "localhost-nodeport-rejected-tcp" accept # handle 12
	}
}
`
	ts := New()
	mustLoad(t, ts, listing)
	want := `add table ip kube-proxy { comment "rules for kube-proxy" ; }
add counter ip kube-proxy localhost-nodeport-rejected-tcp
add set ip kube-proxy affinity-X { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add map ip kube-proxy vm { type ipv4_addr . inet_proto . inet_service : verdict ; }
add chain ip kube-proxy late { type filter hook forward priority 5 ; }
add chain ip kube-proxy pre { type filter hook prerouting priority -110 ; policy drop ; comment "the first base chain" ; }
add chain ip kube-proxy svc
add rule ip kube-proxy late counter accept
add rule ip kube-proxy pre ip daddr . meta l4proto . th dport vmap @vm
add rule ip kube-proxy svc ip saddr @affinity-X counter name "localhost-nodeport-rejected-tcp" accept
add element ip kube-proxy affinity-X { 10.0.0.5 }
add element ip kube-proxy affinity-X { 10.0.0.6 }
add element ip kube-proxy vm { 10.0.0.1 . tcp . 80 comment "a, b : c" : goto svc }
add element ip kube-proxy vm { 10.0.0.2 . udp . 53 : drop }
`
	if diff := cmp.Diff(want, ts.Dump()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"inet filter"}, ts.Foreign()); diff != "" {
		t.Error(diff)
	}
	// Loading a listing again replaces the table instead of adding its rules twice.
	mustLoad(t, ts, listing)
	if diff := cmp.Diff(want, ts.Dump()); diff != "" {
		t.Errorf("after a second load (-want +got):\n%s", diff)
	}
}

func TestListingErrorsNameTheLine(t *testing.T) {
	const listing = "table ip kube-proxy {\n\tchain a {\n\t\taccept\n\t\tlog accept\n\t}\n}\n"
	err := New().Load(listing)
	if err == nil || err.Error() != "line 4: chain a: unexpected token log, expected a match or statement" {
		t.Errorf("error %v", err)
	}
	if err := New().Load("table ip kube-proxy {\n\tchain a {\n"); err == nil || err.Error() != "line 1: block not closed" {
		t.Errorf("error %v", err)
	}
}

func TestPriorities(t *testing.T) {
	for text, want := range map[string]int{
		"-110": -110, "0": 0, "dstnat": -100, "dstnat - 10": -110, "dstnat-10": -110, "srcnat": 100,
		"filter + 5": 5, "filter+5": 5, "raw": -300, "mangle": -150, "security": 50,
	} {
		ts := New()
		err := ts.Load("add table ip kube-proxy\nadd chain ip kube-proxy c { type filter hook input priority " + text + " ; }\n")
		if err != nil {
			t.Errorf("%q: %v", text, err)
			continue
		}
		if got := ts.Table("ip").Chains["c"].Priority; got != want {
			t.Errorf("%q: priority %d, want %d", text, got, want)
		}
	}
}
