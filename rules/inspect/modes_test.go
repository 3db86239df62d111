package inspect

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules"
	"kube-proxy/rules/internal/traceresult"
	"kube-proxy/rules/iptables"
)

// TestInspectorsCoverEveryMode: inspect knows exactly the modes the daemon builds, so a new mode cannot
// be left out of diff, doctor and trace.
func TestInspectorsCoverEveryMode(t *testing.T) {
	got := slices.Sorted(maps.Keys(inspectors))
	if want := rules.Modes(); !slices.Equal(got, want) {
		t.Fatalf("inspect's modes %q, the daemon's %q", got, want)
	}
	for m, ins := range inspectors {
		if ins.render == nil || ins.prereqs == nil {
			t.Errorf("mode %s: no render or no prerequisites", m)
		}
	}
}

// TestPrereqsForDefault: an empty mode (iptables, the default) and a mode this kube-proxy does not run
// get mode iptables' checks, as doctor always gave them; the others their own.
func TestPrereqsForDefault(t *testing.T) {
	ptr := func(f func(*config.KubeProxyConfiguration) []Finding) uintptr { return reflect.ValueOf(f).Pointer() }
	ipt := ptr(inspectors[config.ModeIPTables].prereqs)
	for _, m := range []config.ProxyMode{"", config.ModeKernelspace, "bogus", config.ModeIPTables, config.ModeUserspace} {
		if got := ptr(prereqsFor(m)); got != ipt {
			t.Errorf("mode %q: not mode iptables' prerequisites", m)
		}
	}
	for _, m := range []config.ProxyMode{config.ModeIPVS, config.ModeNFTables} {
		if ptr(prereqsFor(m)) == ipt {
			t.Errorf("mode %q: mode iptables' prerequisites, not its own", m)
		}
	}
}

// TestRenderDesiredRefuses: modes diff cannot render keep their messages.
func TestRenderDesiredRefuses(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, proxy.Node{Name: proxytest.NodeName, Known: true})
	for mode, want := range map[config.ProxyMode]string{
		config.ModeUserspace:   "diff cannot render mode userspace: its rules name the listener ports the running daemon chose; `kube-proxy trace` checks them",
		config.ModeKernelspace: "diff does not render mode kernelspace",
	} {
		cfg := config.Default()
		cfg.Mode = mode
		if _, err := RenderDesired(cfg, []*proxy.Snapshot{snap}, nil, iptables.NFAcct{}); err == nil || err.Error() != want {
			t.Errorf("mode %s: error %v, want %q", mode, err, want)
		}
	}
}

// TestReasonFromModes: trace's reasons for the modes' own filters come from the modes, word for word as
// before they moved there, whichever mode's walk meets them (stale rules of another mode beside the
// walk's own).
func TestReasonFromModes(t *testing.T) {
	pkt := Packet{Src: netip.MustParseAddr("203.0.113.1"), Dst: netip.MustParseAddr("10.96.0.10"), Protocol: "tcp", Port: 81, In: "eth0"}
	for _, tt := range []struct{ verdict, last, want string }{
		{"REJECT", "filter/KUBE-IPVS-FILTER: -A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
			"10.96.0.10 is a Service address on kube-ipvs0, but no Service serves tcp port 81 on it (mode ipvs' KUBE-IPVS-FILTER rejects it)"},
		{"REJECT", `filter/KUBE-PORTALS-FILTER: -A KUBE-PORTALS-FILTER -d 10.96.0.10/32 -p tcp -m comment --comment "ns/web:http" -m tcp --dport 81 -j REJECT`,
			`the Service has no ready endpoints (mode userspace rejects it before it reaches the proxy) (rule comment: "ns/web:http")`},
		{"DROP", `filter/KUBE-PORTALS-FILTER: -A KUBE-PORTALS-FILTER -d 10.96.0.10/32 -p tcp -m tcp --dport 81 -j DROP`,
			"mode userspace drops it: the Service's traffic policy is Local and no endpoint of it runs on this node, or the source is not in its loadBalancerSourceRanges"},
		{"DROP", "filter/KUBE-FORWARD: -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP", "conntrack considers the packet INVALID"},
		{"DROP", "filter/KUBE-FORWARD: -A KUBE-FORWARD -m something --new -j DROP", "conntrack considers the packet INVALID"},
		{"DROP", "filter/OTHER: -A OTHER -j DROP", catchAllStop},
	} {
		o := traceresult.Outcome{Verdict: tt.verdict, Rules: []string{"nat/PREROUTING: -A PREROUTING -j KUBE-SERVICES", tt.last}}
		for _, mode := range []config.ProxyMode{config.ModeIPTables, config.ModeIPVS, config.ModeUserspace} {
			if got := reason(walked{mode: mode}, o, pkt); got != tt.want {
				t.Errorf("mode %s: reason(%s) = %q, want %q", mode, tt.last, got, tt.want)
			}
		}
	}
}

// TestServiceOf: the Service a walk went through is read from mode iptables' comments and mode nftables'
// chain names, the last rule that names one first.
func TestServiceOf(t *testing.T) {
	for _, tt := range []struct {
		rules []string
		want  string
	}{
		{[]string{`nat/KUBE-SERVICES: -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "ns/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-ABC`,
			"nat/KUBE-SVC-ABC: -A KUBE-SVC-ABC -j KUBE-SEP-DEF"}, "ns/web:http"},
		{[]string{`nat/KUBE-SERVICES: -A KUBE-SERVICES -m comment --comment "ns/a cluster IP" -j KUBE-SVC-A`,
			`nat/KUBE-SEP-B: -A KUBE-SEP-B -m comment --comment ns/b -j DNAT --to-destination 10.0.0.1:80`}, "ns/b"},
		{[]string{"services: ip daddr . meta l4proto . th dport vmap @service-ips",
			"service-ABCDEFGH-ns/web/tcp/http: numgen random mod 1 vmap { 0 : goto endpoint-X }"}, "ns/web:http"},
		{[]string{"external-ABCDEFGH-ns/dns/udp/: jump mark-for-masquerade"}, "ns/dns"},
		{[]string{"local-ABCDEFGH-ns/dns/udp/: meta l4proto udp dnat to 10.244.1.5:53"}, "ns/dns"},
		{[]string{"endpoint-ABCDEFGH-ns/web/tcp/http__10.244.1.5/8080: ip saddr 10.244.1.5 jump mark-for-masquerade"}, "ns/web:http"},
		{[]string{`filter/KUBE-FORWARD: -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -j ACCEPT`}, ""},
		{nil, ""},
	} {
		if got := serviceOf(config.ModeIPTables, tt.rules); got != tt.want {
			t.Errorf("serviceOf(%q) = %q, want %q", tt.rules, got, tt.want)
		}
	}
}

// TestStickyAndRedirected: affinity hits and redirects to the node's proxy are recognised in the rules of
// the modes that write them.
func TestStickyAndRedirected(t *testing.T) {
	ipt := "nat/KUBE-SVC-ABC: -A KUBE-SVC-ABC -m recent --name KUBE-SEP-DEF --rcheck --seconds 10800 --reap -j KUBE-SEP-DEF"
	nft := "service-ABCDEFGH-ns/web/tcp/http: ip saddr @affinity-ABCDEFGH-ns/web/tcp/http__10.0.0.1/80 goto endpoint-ABCDEFGH-ns/web/tcp/http__10.0.0.1/80"
	set := "nat/KUBE-SEP-DEF: -A KUBE-SEP-DEF -m recent --name KUBE-SEP-DEF --set -m tcp -p tcp -j DNAT --to-destination 10.0.0.1:80"
	redirect := "nat/KUBE-PORTALS-CONTAINER: -A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 30001"
	for _, tt := range []struct {
		rules            []string
		sticky, redirect bool
	}{
		{[]string{ipt, set}, true, false},
		{[]string{nft}, true, false},
		{[]string{set}, false, false},
		{[]string{redirect}, false, true},
	} {
		o := traceresult.Outcome{Verdict: "ACCEPT", Endpoint: "10.0.0.1:80", Rules: tt.rules}
		if got := sticky(config.ModeIPTables, tt.rules); got != tt.sticky {
			t.Errorf("sticky(%q) = %v", tt.rules, got)
		}
		if got := redirected(config.ModeIPTables, o); got != tt.redirect {
			t.Errorf("redirected(%q) = %v", tt.rules, got)
		}
	}
}
