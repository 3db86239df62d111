package iptables

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/iptables/iptrace"
)

func TestChainNames(t *testing.T) {
	// Upstream's names for the same Service ports (DESIGN.md and upstream's proxier tests).
	p := func(ns, portName string) proxy.ServicePortName {
		return port(ns, portName, v1.ProtocolTCP, "10.0.0.1", 80).Name
	}
	for _, tc := range []struct{ got, want string }{
		{ServiceChainName(PrefixService, p("default/clusterip-service", "")), "KUBE-SVC-KUSV3H3OUX7H3MDQ"},
		{EndpointChainName(p("default/clusterip-service", ""), "192.168.11.73:80"), "KUBE-SEP-HHZALBXPKUQGKXIS"},
		{ServiceChainName(PrefixService, p("ns1/svc1", "p80")), "KUBE-SVC-XPGD46QRK7WJZT7O"},
		{EndpointChainName(p("ns1/svc1", "p80"), "10.180.0.1:80"), "KUBE-SEP-SXIVWICOYRO3J4NJ"},
		{ServiceChainName(PrefixServiceExternal, p("ns2/svc2", "p80")), "KUBE-EXT-GNZBNJ2PO5MGZ6GT"},
		{ServiceChainName(PrefixServiceFirewall, p("ns5/svc5", "p80")), "KUBE-FW-NUKIZ6OKUXPJNT4C"},
		{ServiceChainName(PrefixServiceLocal, p("ns2/svc2", "p80")), "KUBE-SVL-GNZBNJ2PO5MGZ6GT"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

func TestRenderErrors(t *testing.T) {
	r := NewRenderer(testConfig(v4, proxy.LocalDetector{}))
	if _, err := r.Render(snapshot(v6, proxy.Node{}), nil, true, nil); err == nil {
		t.Error("an IPv6 snapshot rendered by an IPv4 renderer: no error")
	}
	if _, err := r.Render(nil, nil, true, nil); err == nil {
		t.Error("no snapshot: no error")
	}
	bad := seed000()
	for _, sp := range bad.Services {
		sp.ClusterEndpoints = nil // HasAnyEndpoints stays true
	}
	if _, err := r.Render(bad, nil, true, nil); err == nil || !strings.Contains(err.Error(), "inconsistent snapshot") {
		t.Errorf("inconsistent snapshot: error %v", err)
	}
	// The renderer recovers.
	res, err := r.Render(seed000(), bad, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := NewRenderer(testConfig(v4, proxy.LocalDetector{})).Render(seed000(), nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(fresh.Payload), string(res.Payload)); diff != "" {
		t.Errorf("after an error (-fresh +got):\n%s", diff)
	}
}

// TestPartialAfterUnappliedRender covers a writer that rendered a snapshot it could not apply: the next
// partial render against the last applied snapshot still converges, as does a partial render by a renderer
// that never saw prev.
func TestPartialAfterUnappliedRender(t *testing.T) {
	cfg := testConfig(v4, clusterCIDR("10.244.0.0/16"))
	a := snapshot(v4, v4Node("10.0.0.1"),
		port("ns/a", "", v1.ProtocolTCP, "10.96.0.1", 80, eps("10.244.1.1:80", "10.244.1.2:80")),
		port("ns/b", "", v1.ProtocolTCP, "10.96.0.2", 80, nodePort(30002), eps("10.244.1.3:80")),
		port("ns/c", "", v1.ProtocolUDP, "10.96.0.3", 53, eps("10.244.1.4:53")))
	b := derive(a, []proxy.ServicePortName{port("ns/c", "", v1.ProtocolUDP, "10.96.0.3", 53).Name},
		port("ns/a", "", v1.ProtocolTCP, "10.96.0.1", 80, eps("10.244.1.1:80")))
	c := derive(b, nil,
		port("ns/b", "", v1.ProtocolTCP, "10.96.0.2", 80, nodePort(30002), etpLocal(0), eps("10.244.1.3:80,local")),
		port("ns/d", "", v1.ProtocolTCP, "10.96.0.4", 80, eps("10.244.1.5:80")))

	want := iptrace.New(false)
	full, err := NewRenderer(cfg).Render(c, nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := want.Restore(full.Payload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}

	for name, renderers := range map[string]func() *Renderer{
		"renderer saw b": func() *Renderer {
			r := NewRenderer(cfg)
			mustRender(t, r, a, nil, true)
			mustRender(t, r, b, a, false) // never applied
			return r
		},
		"fresh renderer": func() *Renderer { return NewRenderer(cfg) },
	} {
		t.Run(name, func(t *testing.T) {
			kernel := iptrace.New(false)
			applyFull := NewRenderer(cfg)
			if err := kernel.Restore(mustRender(t, applyFull, a, nil, true), iptrace.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatal(err)
			}
			r := renderers()
			if err := kernel.Restore(mustRender(t, r, c, a, false), iptrace.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.SaveAll(), kernel.SaveAll()); diff != "" {
				t.Errorf("(-full +partial):\n%s", diff)
			}
		})
	}
}

func mustRender(t *testing.T, r *Renderer, snap, prev *proxy.Snapshot, full bool) []byte {
	t.Helper()
	res, err := r.Render(snap, prev, full, nil)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), res.Payload...)
}

// TestPartialRewritesAllOnNodeChange: with NodeCIDR detection, a new pod CIDR changes every Service's
// masquerade rule, so a partial render rewrites them all.
func TestPartialRewritesAllOnNodeChange(t *testing.T) {
	cfg := testConfig(v4, proxy.LocalDetector{Mode: config.LocalModeNodeCIDR})
	node := v4Node("10.0.0.1")
	node.PodCIDRs = prefixes("10.244.1.0/24")
	a := snapshot(v4, node,
		port("ns/a", "", v1.ProtocolTCP, "10.96.0.1", 80, eps("10.244.1.1:80")),
		port("ns/b", "", v1.ProtocolTCP, "10.96.0.2", 80, eps("10.244.1.3:80")))
	b := derive(a, nil)
	b.Node.PodCIDRs = prefixes("10.244.7.0/24")
	r := NewRenderer(cfg)
	mustRender(t, r, a, nil, true)
	res, err := r.Render(b, a, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Full {
		t.Error("Full = false after the pod CIDR changed")
	}
	if n := strings.Count(string(res.Payload), "! -s 10.244.7.0/24 -j KUBE-MARK-MASQ"); n != 2 {
		t.Errorf("%d masquerade rules with the new pod CIDR, want 2:\n%s", n, res.Payload)
	}
}

func TestJumpRulesAndCanaries(t *testing.T) {
	var got []string
	for _, j := range JumpRules(Config{}) {
		got = append(got, j.Table+" "+j.Chain+" "+strings.Join(j.RuleSpec(), " "))
	}
	want := []string{
		"filter INPUT -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES",
		"filter FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES",
		"filter INPUT -m comment --comment kubernetes health check service ports -j KUBE-NODEPORTS",
		"filter FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"filter OUTPUT -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"filter FORWARD -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD",
		"filter INPUT -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
		"filter OUTPUT -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
		"filter FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
		"nat OUTPUT -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"nat PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"nat POSTROUTING -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING",
		"filter INPUT -j KUBE-FIREWALL",
		"filter OUTPUT -j KUBE-FIREWALL",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("JumpRules (-want +got):\n%s", diff)
	}
	canaries := CanaryChains()
	if len(canaries) != 3 || canaries[0] != (struct{ Table, Chain string }{"mangle", "KUBE-PROXY-CANARY"}) {
		t.Errorf("CanaryChains = %v", canaries)
	}
}

func TestLocalhostNodePortsActive(t *testing.T) {
	node := v4Node("10.0.0.1")
	cfg := func(family v1.IPFamily, localhost bool, nodePortAddresses ...string) Config {
		return Config{Settings: proxy.Settings{Family: family, LocalhostNodePorts: localhost,
			NodePortAddresses: npAddrs(family, nodePortAddresses...)}}
	}
	for _, tc := range []struct {
		cfg  Config
		want bool
	}{
		{cfg(v4, true), true},
		{cfg(v4, false), false},
		{cfg(v6, true), false},
		{cfg(v4, true, "10.0.0.0/8"), false},
		{cfg(v4, true, "10.0.0.0/8", "127.0.0.0/8"), true},
		{cfg(v4, true, "fd00::/8"), true}, // none of this family: all
		{cfg(v4, true, "primary"), false},
		{cfg(v4, true, "0.0.0.0/1"), true},
	} {
		if got := tc.cfg.LocalhostNodePortsActive(&node); got != tc.want {
			t.Errorf("%+v: got %v, want %v", tc.cfg, got, tc.want)
		}
	}
	// "primary" before the Node is known selects nothing, which means all addresses, as upstream does
	// when the node IP is unknown at start-up; a bindAddress is the primary IP from the start.
	unknown := proxy.Node{Name: testNode}
	primary := cfg(v4, true, "primary")
	if !primary.LocalhostNodePortsActive(&unknown) {
		t.Error("primary without node IPs should select all addresses")
	}
	primary.BindAddress = mustAddr("10.0.0.9")
	if primary.LocalhostNodePortsActive(&unknown) {
		t.Error("primary with a bindAddress selects that address, not loopback")
	}
}
