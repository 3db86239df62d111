package harness

import (
	"slices"
	"strings"
	"testing"
)

// listingA and listingB are the same table as nft could list it twice: elements, anonymous-set entries and
// blocks in other orders.
const listingA = `table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 10.96.0.1, 10.96.35.207,
			     10.96.99.206 }
	}

	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.1 . tcp . 443 comment "a, {b}" : goto reject-chain,
			     10.96.0.2 . udp . 53 comment "c" : drop }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
	}

	chain filter-input {
		type filter hook input priority filter; policy accept;
		ct state new jump nodeport-endpoints-check
		ct state new jump service-endpoints-check
	}

	chain reject-chain {
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}

	chain service-X/web/tcp/tcp {
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.2 . 8080, 1 : 10.244.2.2 . 8080 }
	}
}
table ip6 kube-proxy {
	set cluster-ips {
		type ipv6_addr
	}
}
`

const listingB = `table ip6 kube-proxy {
	set cluster-ips {
		type ipv6_addr
	}
}
table ip kube-proxy {
	comment "rules for kube-proxy"
	chain service-X/web/tcp/tcp {
		meta l4proto tcp dnat ip to numgen random mod 2 map { 1 : 10.244.2.2 . 8080, 0 : 10.244.1.2 . 8080 }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
	}

	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 10.96.99.206, 10.96.0.1, 10.96.35.207 }
	}

	chain reject-chain {
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}

	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.2 . udp . 53 comment "c" : drop,
			     10.96.0.1 . tcp . 443 comment "a, {b}" : goto reject-chain }
	}

	chain filter-input {
		type filter hook input priority filter; policy accept;
		ct state new jump nodeport-endpoints-check
		ct state new jump service-endpoints-check
	}
}
`

func TestParseNFT(t *testing.T) {
	tables, err := ParseNFT(listingA)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 2 || tables[0].Family != "ip" || tables[0].Name != "kube-proxy" || tables[1].Family != "ip6" {
		t.Fatalf("tables: %+v", tables)
	}
	ip := tables[0]
	if !slices.Equal(ip.Lines, []string{`comment "rules for kube-proxy"`}) {
		t.Errorf("table lines %q", ip.Lines)
	}
	if got := ip.Block("set", "cluster-ips").Elements; !slices.Equal(got, []string{"10.96.0.1", "10.96.35.207", "10.96.99.206"}) {
		t.Errorf("cluster-ips elements %q", got)
	}
	want := []string{`10.96.0.1 . tcp . 443 comment "a, {b}" : goto reject-chain`, `10.96.0.2 . udp . 53 comment "c" : drop`}
	if got := ip.Block("map", "no-endpoint-services").Elements; !slices.Equal(got, want) {
		t.Errorf("no-endpoint-services elements %q, want %q", got, want)
	}
	if e := ip.Block("map", "service-nodeports").Elements; e != nil {
		t.Errorf("an empty map has elements %q", e)
	}
	if got := ip.Block("chain", "filter-input").Rules(); !slices.Equal(got, []string{"ct state new jump nodeport-endpoints-check", "ct state new jump service-endpoints-check"}) {
		t.Errorf("filter-input rules %q", got)
	}
	if got := ip.Block("chain", "reject-chain").Rules(); !slices.Equal(got, []string{"reject"}) {
		t.Errorf("reject-chain rules %q", got)
	}
	if got := ip.Names("chain"); !slices.Equal(got, []string{"filter-input", "reject-chain", "service-X/web/tcp/tcp"}) {
		t.Errorf("chains %q", got)
	}
	for _, bad := range []string{"table ip x {\n", "chain x {\n}\n", "table ip x {\n\tset s {\n\t\telements = { 1,\n"} {
		if _, err := ParseNFT(bad); err == nil {
			t.Errorf("ParseNFT(%q) did not fail", bad)
		}
	}
}

func TestNormalizeNFT(t *testing.T) {
	a, err := NormalizeNFT(listingA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NormalizeNFT(listingB)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("the same table normalises differently:\n%s\n---\n%s", a, b)
	}
	// What is not an order of elements or blocks still differs: rule order, a rule, an element.
	for _, change := range [][2]string{
		{"ct state new jump nodeport-endpoints-check\n\t\tct state new jump service-endpoints-check", "ct state new jump service-endpoints-check\n\t\tct state new jump nodeport-endpoints-check"},
		{"0 : 10.244.1.2 . 8080, 1 : 10.244.2.2", "0 : 10.244.2.2 . 8080, 1 : 10.244.1.2"},
		{"10.96.35.207,", "10.96.35.208,"},
		{`comment "c" : drop`, `comment "c" : goto reject-chain`},
	} {
		if !strings.Contains(listingA, change[0]) {
			t.Fatalf("test listing lacks %q", change[0])
		}
		c, err := NormalizeNFT(strings.Replace(listingA, change[0], change[1], 1))
		if err != nil {
			t.Fatal(err)
		}
		if c == a {
			t.Errorf("changing %q to %q made no difference", change[0], change[1])
		}
	}
}

func TestSortAnonymousSets(t *testing.T) {
	for in, want := range map[string]string{
		"ip saddr != { 10.1.0.0/16, 10.0.0.0/16 } drop":       "ip saddr != { 10.0.0.0/16, 10.1.0.0/16 } drop",
		`meta l4proto tcp comment "x { b, a }"`:               `meta l4proto tcp comment "x { b, a }"`,
		"update @s { ip saddr }":                              "update @s { ip saddr }",
		"numgen random mod 2 vmap { 1 : goto b, 0 : goto a }": "numgen random mod 2 vmap { 0 : goto a, 1 : goto b }",
		"x { b, { d, c } } y { 2, 1 }":                        "x { b, { c, d } } y { 1, 2 }",
	} {
		if got := SortAnonymousSets(in); got != want {
			t.Errorf("SortAnonymousSets(%q) = %q, want %q", in, got, want)
		}
	}
}
