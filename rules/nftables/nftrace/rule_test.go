package nftrace

import (
	"fmt"
	"strings"
	"testing"
)

// ruleShapes are the rule shapes kube-proxy writes (and a few more), each as written in a transaction, as
// nft 1.0.6 prints it back (TestRuleShapesAgainstKernel checks this column against a real kernel), and in
// the tracer's canonical form. The rules live in the regular chain "shapes" of shapesHeader's table.
var ruleShapes = []struct {
	family           string
	written, printed string
	canonical        string // "" when it is the written form
}{
	{family: "ip", written: `ip daddr 10.0.0.1 accept`, printed: `ip daddr 10.0.0.1 accept`},
	{family: "ip", written: `ip daddr != 10.0.0.0/8 return`, printed: `ip daddr != 10.0.0.0/8 return`},
	{family: "ip", written: `ip saddr { 10.0.0.1, 10.1.0.0/16, 192.168.0.0/24 } drop`, printed: `ip saddr { 10.0.0.1, 10.1.0.0/16, 192.168.0.0/24 } drop`},
	{family: "ip", written: `ip saddr != { 203.0.113.0/25 } drop`, printed: `ip saddr != 203.0.113.0/25 drop`, canonical: `ip saddr != 203.0.113.0/25 drop`},
	{family: "ip", written: `ip saddr != { 203.0.113.0/25, 5.6.7.8 } drop`, printed: `ip saddr != { 5.6.7.8, 203.0.113.0/25 } drop`, canonical: `ip saddr != { 5.6.7.8, 203.0.113.0/25 } drop`},
	{family: "ip", written: `ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"`, printed: `ip daddr 172.30.0.0/16 drop comment "Drop traffic to unallocated ClusterIPs"`, canonical: `ip daddr 172.30.0.0/16 drop comment "Drop traffic to unallocated ClusterIPs"`},
	{family: "ip", written: `ip daddr @cluster-ips reject`, printed: `ip daddr @cluster-ips reject`},
	{family: "ip", written: `ip saddr . ip daddr . meta l4proto . th dport @hairpin accept`, printed: `ip saddr . ip daddr . meta l4proto . th dport @hairpin accept`},
	{family: "ip", written: `ip daddr . meta l4proto . th dport vmap @service-ips`, printed: `ip daddr . meta l4proto . th dport vmap @service-ips`},
	{family: "ip", written: `meta l4proto . th dport vmap @nodeports`, printed: `meta l4proto . th dport vmap @nodeports`},
	{family: "ip", written: `ip daddr . meta l4proto . th dport vmap { 10.0.0.2 . udp . 53 : drop , 10.0.0.1 . tcp . 80 : goto target }`,
		printed:   `ip daddr . meta l4proto . th dport vmap { 10.0.0.2 . udp . 53 : drop, 10.0.0.1 . tcp . 80 : goto target }`,
		canonical: `ip daddr . meta l4proto . th dport vmap { 10.0.0.1 . tcp . 80 : goto target, 10.0.0.2 . udp . 53 : drop }`},
	{family: "ip", written: `numgen random mod 3 vmap { 0 : goto target , 1 : goto target , 2 : jump target }`,
		printed:   `numgen random mod 3 vmap { 0 : goto target, 1 : goto target, 2 : jump target }`,
		canonical: `numgen random mod 3 vmap { 0 : goto target, 1 : goto target, 2 : jump target }`},
	{family: "ip", written: `iifname "eth0" accept`, printed: `iifname "eth0" accept`},
	{family: "ip", written: `iifname eth0 accept`, printed: `iifname "eth0" accept`, canonical: `iifname "eth0" accept`},
	{family: "ip", written: `iifname "veth*" accept`, printed: `iifname "veth*" accept`},
	{family: "ip", written: `iifname != "br0" accept`, printed: `iifname != "br0" accept`},
	{family: "ip", written: `oifname "eth1" accept`, printed: `oifname "eth1" accept`},
	{family: "ip", written: `meta l4proto tcp accept`, printed: `meta l4proto tcp accept`},
	{family: "ip", written: `meta l4proto { tcp, udp } accept`, printed: `meta l4proto { tcp, udp } accept`},
	{family: "ip", written: `meta l4proto tcp th dport 80 accept`, printed: `tcp dport 80 accept`, canonical: `tcp dport 80 accept`},
	{family: "ip", written: `meta l4proto udp ip daddr 10.0.0.1 th dport { 53, 5353 } accept`, printed: `ip daddr 10.0.0.1 udp dport { 53, 5353 } accept`, canonical: `ip daddr 10.0.0.1 udp dport { 53, 5353 } accept`},
	{family: "ip", written: `th dport 80 accept`, printed: `th dport 80 accept`},
	{family: "ip", written: `tcp dport != 80 accept`, printed: `tcp dport != 80 accept`},
	{family: "ip", written: `ct state new jump target`, printed: `ct state new jump target`},
	{family: "ip", written: `ct state established,related accept`, printed: `ct state established,related accept`},
	{family: "ip", written: `ct status dnat accept`, printed: `ct status dnat accept`},
	{family: "ip", written: `fib daddr type local accept`, printed: `fib daddr type local accept`},
	{family: "ip", written: `fib saddr type != local accept`, printed: `fib saddr type != local accept`},
	{family: "ip", written: `mark and 0x4000 != 0 accept`, printed: `meta mark & 0x00004000 != 0x00000000 accept`},
	{family: "ip", written: `mark 0x4000 accept`, printed: `meta mark 0x00004000 accept`},
	{family: "ip", written: `mark set mark or 0x4000`, printed: `meta mark set meta mark | 0x00004000`},
	{family: "ip", written: `mark set mark xor 0x4000`, printed: `meta mark set meta mark ^ 0x00004000`},
	{family: "ip", written: `mark set 0x10`, printed: `meta mark set 0x00000010`},
	{family: "ip", written: `counter`, printed: `counter packets 0 bytes 0`},
	{family: "ip", written: `counter name "cnt" reject`, printed: `counter name "cnt" reject`},
	{family: "ip", written: `reject with icmp type host-unreachable`, printed: `reject with icmp host-unreachable`, canonical: `reject with icmp host-unreachable`},
	{family: "ip", written: `reject with tcp reset`, printed: `reject with tcp reset`},
	{family: "ip", written: `masquerade`, printed: `masquerade`},
	{family: "ip", written: `mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random`, printed: `meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random`},
	{family: "ip", written: `meta l4proto tcp dnat to 10.1.2.3:80`, printed: `meta l4proto tcp dnat to 10.1.2.3:80`},
	{family: "ip", written: `meta l4proto tcp dnat ip to 10.1.2.3:80`, printed: `meta l4proto tcp dnat to 10.1.2.3:80`, canonical: `meta l4proto tcp dnat to 10.1.2.3:80`},
	{family: "ip", written: `dnat to 10.1.2.3`, printed: `dnat to 10.1.2.3`},
	{family: "ip", written: `meta l4proto { tcp, udp } dnat to 10.1.2.3:80`, printed: `meta l4proto { tcp, udp } dnat to 10.1.2.3:80`},
	{family: "ip", written: `tcp dport 80 dnat to 10.1.2.3:8080`, printed: `tcp dport 80 dnat to 10.1.2.3:8080`},
	{family: "ip", written: `meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.1.1.1 . 80 , 1 : 10.1.1.2 . 8080 }`,
		printed:   `meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.1.1.1 . 80, 1 : 10.1.1.2 . 8080 }`,
		canonical: `meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.1.1.1 . 80, 1 : 10.1.1.2 . 8080 }`},
	{family: "ip", written: `dnat to numgen random mod 2 map { 0 : 10.1.1.1, 1 : 10.1.1.2 }`, printed: `dnat to numgen random mod 2 map { 0 : 10.1.1.1, 1 : 10.1.1.2 }`},
	{family: "ip", written: `update @aff { ip saddr }`, printed: `update @aff { ip saddr }`},
	{family: "ip", written: `ip saddr @aff goto target`, printed: `ip saddr @aff goto target`},
	{family: "ip", written: `accept comment "a comment"`, printed: `accept comment "a comment"`},
	{family: "ip", written: `goto target`, printed: `goto target`},
	{family: "ip", written: `drop`, printed: `drop`},
	{family: "ip6", written: `ip6 daddr != ::1 meta l4proto . th dport vmap @nodeports`, printed: `ip6 daddr != ::1 meta l4proto . th dport vmap @nodeports`},
	{family: "ip6", written: `ip6 daddr { fd00:10:96::/112 } drop`, printed: `ip6 daddr fd00:10:96::/112 drop`, canonical: `ip6 daddr fd00:10:96::/112 drop`},
	{family: "ip6", written: `ip6 saddr != { 2001:db8:203::/64, 2001:db8::5 } drop`, printed: `ip6 saddr != { 2001:db8::5, 2001:db8:203::/64 } drop`, canonical: `ip6 saddr != { 2001:db8::5, 2001:db8:203::/64 } drop`},
	{family: "ip6", written: `ip6 saddr . ip6 daddr . meta l4proto . th dport @hairpin accept`, printed: `ip6 saddr . ip6 daddr . meta l4proto . th dport @hairpin accept`},
	{family: "ip6", written: `meta l4proto tcp dnat to [fd00:10:180::1]:80`, printed: `meta l4proto tcp dnat to [fd00:10:180::1]:80`},
	{family: "ip6", written: `meta l4proto tcp dnat ip6 to [fd00:10:180::1]:80`, printed: `meta l4proto tcp dnat to [fd00:10:180::1]:80`, canonical: `meta l4proto tcp dnat to [fd00:10:180::1]:80`},
	{family: "ip6", written: `meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10:180::4 . 80 , 1 : fd00:10:180::5 . 80 }`,
		printed:   `meta l4proto tcp dnat ip6 to numgen random mod 2 map { 0 : fd00:10:180::4 . 80, 1 : fd00:10:180::5 . 80 }`,
		canonical: `meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10:180::4 . 80, 1 : fd00:10:180::5 . 80 }`},
	{family: "ip6", written: `update @aff { ip6 saddr }`, printed: `update @aff { ip6 saddr }`},
	{family: "ip6", written: `ip6 saddr @aff goto target`, printed: `ip6 saddr @aff goto target`},
}

// shapesHeader declares what ruleShapes refer to, in a table of the family.
func shapesHeader(family string) string {
	addr := "ipv4_addr"
	if family == "ip6" {
		addr = "ipv6_addr"
	}
	return strings.NewReplacer("FAM", family, "ADDR", addr).Replace(`add table FAM kube-proxy
add chain FAM kube-proxy target
add chain FAM kube-proxy shapes
add counter FAM kube-proxy cnt
add set FAM kube-proxy cluster-ips { type ADDR ; }
add set FAM kube-proxy aff { type ADDR ; flags dynamic,timeout ; timeout 10800s ; }
add set FAM kube-proxy hairpin { type ADDR . ADDR . inet_proto . inet_service ; }
add map FAM kube-proxy service-ips { type ADDR . inet_proto . inet_service : verdict ; }
add map FAM kube-proxy nodeports { type inet_proto . inet_service : verdict ; }
`)
}

// shapesTransaction is the header and every shape of the family, as written.
func shapesTransaction(family string) string {
	var b strings.Builder
	b.WriteString(shapesHeader(family))
	for _, s := range ruleShapes {
		if s.family == family {
			fmt.Fprintf(&b, "add rule %s kube-proxy shapes %s\n", family, s.written)
		}
	}
	return b.String()
}

func TestRuleShapes(t *testing.T) {
	for _, s := range ruleShapes {
		want := s.canonical
		if want == "" {
			want = s.written
		}
		for _, text := range []string{s.written, s.printed} {
			ts := New()
			payload := shapesHeader(s.family) + fmt.Sprintf("add rule %s kube-proxy shapes %s\n", s.family, text)
			if err := ts.Load(payload); err != nil {
				t.Errorf("%q: %v", text, err)
				continue
			}
			if got := ts.Rules(s.family, "shapes"); len(got) != 1 || got[0] != want {
				t.Errorf("%q parsed as %q, want %q", text, got, want)
			}
		}
	}
}

// TestRuleShapesRoundTrip loads every shape of a family at once, and its canonical dump again.
func TestRuleShapesRoundTrip(t *testing.T) {
	for _, family := range []string{"ip", "ip6"} {
		ts := New()
		if err := ts.Load(shapesTransaction(family)); err != nil {
			t.Fatal(err)
		}
		again := New()
		if err := again.Load(ts.Dump()); err != nil {
			t.Fatalf("loading the dump: %v\n%s", err, ts.Dump())
		}
		if again.Dump() != ts.Dump() {
			t.Errorf("%s: the dump does not load back to the same state", family)
		}
	}
}

func TestRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		rule    string
		errPart string
	}{
		{`log prefix "x" accept`, `unexpected token log`},
		{`ip daddr 10.0.0.1 limit rate 10/second accept`, `unexpected token limit`},
		{`ip6 daddr ::1 accept`, `conflicting protocols: ip6 in an ip table`},
		{`ip daddr fd00::1 accept`, `bad ipv4_addr "fd00::1"`},
		{`ip daddr 10.0.0.1/8/3 accept`, `bad ipv4_addr prefix`},
		{`ip dscp 4 accept`, `unexpected token dscp, expected saddr or daddr`},
		{`th sport 80 accept`, `unexpected token sport, expected dport`},
		{`meta l4proto gre accept`, `unsupported protocol "gre"`},
		{`accept drop`, `unexpected token drop, nothing may follow "accept"`},
		{`dnat to 10.1.2.3:80`, `transport protocol mapping is only valid after transport protocol match`},
		{`meta l4proto tcp dnat to fd00::1`, `destination fd00::1 is not an ip address`},
		{`meta l4proto tcp dnat ip6 to 10.0.0.1`, `conflicting protocols`},
		{`numgen inc mod 2 vmap { 0 : drop }`, `unexpected token inc, expected "random"`},
		{`numgen random mod 2 vmap { 2 : drop }`, `numgen map index 2 is not below the modulus 2`},
		{`numgen random mod 2 offset 1 vmap { 0 : drop }`, `numgen offset is not supported`},
		{`ip daddr . meta l4proto vmap { 10.0.0.1 . tcp : reject }`, `unexpected token reject, expected a verdict`},
		{`masquerade to :8080`, `masquerade to a port is not supported`},
		{`ct state new comment "x" accept`, `expected the end of the rule after its comment`},
		{`ip daddr 10.0.0.1`, ``},
		{`snat to 1.2.3.4`, `unexpected token snat`},
	} {
		ts := New()
		err := ts.Load(shapesHeader("ip") + "add rule ip kube-proxy shapes " + tc.rule + "\n")
		switch {
		case tc.errPart == "" && err != nil:
			t.Errorf("%q: unexpected error %v", tc.rule, err)
		case tc.errPart != "" && err == nil:
			t.Errorf("%q: no error, want one containing %q", tc.rule, tc.errPart)
		case err != nil && !strings.Contains(err.Error(), tc.errPart):
			t.Errorf("%q: error %q does not contain %q", tc.rule, err, tc.errPart)
		}
	}
}
