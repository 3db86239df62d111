package userspace

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	pt "kube-proxy/proxy/proxytest"
	"kube-proxy/rules/engine"
)

func testConfig(t *testing.T, mutate func(*config.KubeProxyConfiguration)) Config {
	t.Helper()
	c := config.Default()
	c.Mode = config.ModeUserspace
	c.ClusterCIDR = "10.244.0.0/16"
	if mutate != nil {
		mutate(c)
	}
	cfg, err := ConfigFrom(c, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// fakePorts gives each key of the snapshot's targets a port: 30000 + its index in sorted order.
func fakePorts(snap *proxy.Snapshot) map[engine.Key]uint16 {
	ports := map[engine.Key]uint16{}
	targets := Targets(snap)
	keys := make([]engine.Key, 0, len(targets))
	for k := range targets {
		keys = append(keys, k)
	}
	sortKeys(keys)
	for i, k := range keys {
		ports[k] = uint16(30000 + i)
	}
	return ports
}

func sortKeys(keys []engine.Key) {
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if compareKeys(keys[j], keys[i]) < 0 {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
}

func render(cfg Config, snap *proxy.Snapshot) (map[engine.Key]uint16, string) {
	ports := fakePorts(snap)
	return ports, string(Render(cfg, snap, func(k engine.Key) uint16 { return ports[k] }))
}

func rulesOf(payload string) []string {
	var out []string
	for _, l := range strings.Split(payload, "\n") {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out
}

func TestRenderClusterIPNodePortAndNoEndpoints(t *testing.T) {
	node := pt.Node("192.168.1.10")
	snap := pt.Snapshot(v1.IPv4Protocol, node,
		pt.Port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, pt.NodePort(30080),
			pt.Endpoints("10.244.1.2:8080", "10.244.2.3:8080")),
		pt.Port("ns/dns", "dns", v1.ProtocolUDP, "10.96.0.53", 53, pt.Endpoints("10.244.1.9:53")),
		pt.Port("ns/empty", "", v1.ProtocolTCP, "10.96.0.99", 81),
		pt.Port("ns/sctp", "", v1.ProtocolSCTP, "10.96.0.98", 9, pt.Endpoints("10.244.1.9:9")),
	)
	ports, payload := render(testConfig(t, nil), snap)
	if len(ports) != 2 {
		t.Fatalf("listeners %v, want 2 (web cluster, dns cluster)", ports)
	}
	want := []string{
		`-A KUBE-NODEPORT-CONTAINER -p tcp --dport 30080 -m comment --comment "ns/web:http" -j REDIRECT --to-ports 30001`,
		`-A KUBE-NODEPORT-HOST -p tcp --dport 30080 -m comment --comment "ns/web:http" -j REDIRECT --to-ports 30001`,
		`-A KUBE-PORTALS-CONTAINER -d 10.96.0.53/32 -p udp --dport 53 -m comment --comment "ns/dns:dns" -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp --dport 80 -m comment --comment "ns/web:http" -j REDIRECT --to-ports 30001`,
		`-A KUBE-PORTALS-HOST -d 10.96.0.53/32 -p udp --dport 53 -m comment --comment "ns/dns:dns" -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp --dport 80 -m comment --comment "ns/web:http" -j REDIRECT --to-ports 30001`,
		`-A KUBE-PORTALS-FILTER -m conntrack --ctstate DNAT -j RETURN`,
		`-A KUBE-PORTALS-FILTER -d 10.96.0.99/32 -p tcp --dport 81 -m comment --comment "ns/empty" -j REJECT`,
	}
	if diff := cmp.Diff(want, rulesOf(payload)); diff != "" {
		t.Errorf("rules (-want +got):\n%s\npayload:\n%s", diff, payload)
	}
	for _, c := range []string{":KUBE-PORTALS-CONTAINER - [0:0]", ":KUBE-PORTALS-FILTER - [0:0]", "*nat\n", "*filter\n"} {
		if !strings.Contains(payload, c) {
			t.Errorf("payload lacks %q", c)
		}
	}
	if strings.Contains(payload, "sctp") {
		t.Error("SCTP Service captured; the userspace proxy cannot serve it")
	}
}

func TestRenderExternalLocalSourceRangesAndNodePortAddresses(t *testing.T) {
	node := pt.Node("192.168.1.10")
	snap := pt.Snapshot(v1.IPv4Protocol, node,
		pt.Port("ns/lb", "", v1.ProtocolTCP, "10.96.0.20", 80, pt.NodePort(30020),
			pt.ExternalIPs("203.0.113.5"), pt.LoadBalancerIPs("198.51.100.7"), pt.SourceRanges("198.51.100.0/24"),
			pt.ExternalLocal(32000), pt.Endpoints("10.244.1.2:80,local", "10.244.2.3:80")),
	)
	cfg := testConfig(t, func(c *config.KubeProxyConfiguration) {
		c.NodePortAddresses = []string{"192.168.1.0/24"}
	})
	ports, payload := render(cfg, snap)
	cluster, local := ports[engine.Key{Name: "ns/lb", Protocol: v1.ProtocolTCP, Policy: PolicyCluster}], ports[engine.Key{Name: "ns/lb", Protocol: v1.ProtocolTCP, Policy: PolicyLocal}]
	if cluster == 0 || local == 0 {
		t.Fatalf("listeners %v: want a cluster and a local one", ports)
	}
	c := `-m comment --comment "ns/lb"`
	want := []string{
		// NodePort only on the configured addresses; local pods and the node itself to the cluster selection.
		`-A KUBE-NODEPORT-CONTAINER -s 10.244.0.0/16 -d 192.168.1.0/24 -p tcp --dport 30020 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-NODEPORT-CONTAINER -d 192.168.1.0/24 -p tcp --dport 30020 ` + c + ` -j REDIRECT --to-ports 30001`,
		`-A KUBE-NODEPORT-HOST -d 192.168.1.0/24 -p tcp --dport 30020 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-CONTAINER -d 10.96.0.20/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-CONTAINER -s 10.244.0.0/16 -d 203.0.113.5/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-CONTAINER -d 203.0.113.5/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30001`,
		// Source ranges: only allowed sources are redirected; the rest is dropped in filter.
		`-A KUBE-PORTALS-CONTAINER -s 198.51.100.0/24 -d 198.51.100.7/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30001`,
		`-A KUBE-PORTALS-HOST -d 10.96.0.20/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-HOST -d 203.0.113.5/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-HOST -s 198.51.100.0/24 -d 198.51.100.7/32 -p tcp --dport 80 ` + c + ` -j REDIRECT --to-ports 30000`,
		`-A KUBE-PORTALS-FILTER -m conntrack --ctstate DNAT -j RETURN`,
		`-A KUBE-PORTALS-FILTER -d 198.51.100.7/32 -p tcp --dport 80 ` + c + ` -j DROP`,
	}
	if diff := cmp.Diff(want, rulesOf(payload)); diff != "" {
		t.Errorf("rules (-want +got):\n%s\npayload:\n%s", diff, payload)
	}
}

func TestRenderLocalPolicyWithoutLocalEndpointsDrops(t *testing.T) {
	snap := pt.Snapshot(v1.IPv4Protocol, pt.Node("192.168.1.10"),
		pt.Port("ns/np", "", v1.ProtocolTCP, "10.96.0.30", 80, pt.NodePort(30030), pt.ExternalLocal(32001),
			pt.Endpoints("10.244.2.3:80")),
		pt.Port("ns/itp", "", v1.ProtocolTCP, "10.96.0.31", 80, pt.InternalLocal, pt.Endpoints("10.244.2.4:80")),
	)
	_, payload := render(testConfig(t, nil), snap)
	rules := rulesOf(payload)
	for _, w := range []string{
		`-A KUBE-PORTALS-FILTER -m addrtype --dst-type LOCAL -p tcp --dport 30030 -m comment --comment "ns/np" -j DROP`,
		`-A KUBE-PORTALS-FILTER -d 10.96.0.31/32 -p tcp --dport 80 -m comment --comment "ns/itp" -j DROP`,
		// The node's own traffic still reaches the NodePort through the cluster selection, on localhost too.
		`-A KUBE-NODEPORT-HOST -p tcp --dport 30030 -m comment --comment "ns/np" -j REDIRECT --to-ports 30000`,
	} {
		if !contains(rules, w) {
			t.Errorf("missing %s\npayload:\n%s", w, payload)
		}
	}
	for _, r := range rules {
		if strings.Contains(r, "10.96.0.31") && strings.Contains(r, "REDIRECT") {
			t.Errorf("internalTrafficPolicy Local without local endpoints redirected: %s", r)
		}
	}
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

func TestTargetsUseTheSnapshotsSelection(t *testing.T) {
	snap := pt.Snapshot(v1.IPv4Protocol, pt.Node("192.168.1.10"),
		pt.Port("ns/a", "", v1.ProtocolTCP, "10.96.0.40", 80, pt.Affinity(600),
			pt.Endpoints("10.244.1.1:80", "10.244.1.2:80,notready", "10.244.1.3:80,terminating,notready")),
		pt.Port("ns/t", "", v1.ProtocolTCP, "10.96.0.41", 80,
			pt.Endpoints("10.244.1.4:80,terminating,notready", "10.244.1.5:80,terminating,notready,notserving")),
	)
	got := Targets(snap)
	want := map[engine.Key]engine.Target{
		{Name: "ns/a", Protocol: v1.ProtocolTCP, Policy: PolicyCluster}: {
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.1:80")}, Affinity: 600 * time.Second},
		// Only terminating endpoints: the serving one is used (fallback).
		{Name: "ns/t", Protocol: v1.ProtocolTCP, Policy: PolicyCluster}: {
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.4:80")}},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
}

func TestRenderLocalhostNodePortsOff(t *testing.T) {
	snap := pt.Snapshot(v1.IPv4Protocol, pt.Node("192.168.1.10"),
		pt.Port("ns/np", "", v1.ProtocolTCP, "10.96.0.30", 80, pt.NodePort(30030), pt.Endpoints("10.244.2.3:80")))
	off := false
	_, payload := render(testConfig(t, func(c *config.KubeProxyConfiguration) { c.IPTables.LocalhostNodePorts = &off }), snap)
	w := `-A KUBE-NODEPORT-HOST ! -d 127.0.0.0/8 -p tcp --dport 30030 -m comment --comment "ns/np" -j REDIRECT --to-ports 30000`
	if !contains(rulesOf(payload), w) {
		t.Errorf("missing %s\npayload:\n%s", w, payload)
	}
}

func TestStale(t *testing.T) {
	dsts := []Destination{
		{Addr: netip.MustParseAddr("10.96.0.53"), Port: 53, Ports: []uint16{40000}},
		{Port: 30053, Ports: []uint16{40000}},
		{Addr: netip.MustParseAddr("10.96.0.55"), Port: 53, Ports: []uint16{40001}, Opened: true},
	}
	ap := netip.MustParseAddrPort
	for _, tt := range []struct {
		orig, reply string
		stale       bool
	}{
		{"10.96.0.53:53", "192.168.1.10:40000", false}, // current listener
		{"10.96.0.53:53", "192.168.1.10:39999", true},  // an old listener's port
		{"10.96.0.54:53", "192.168.1.10:39999", false}, // not ours
		{"192.168.1.10:30053", "192.168.1.10:39999", true},
		{"10.96.0.53:53", "10.96.0.53:53", false}, // not redirected, but its listener is not new
		{"10.96.0.55:53", "10.96.0.55:53", true},  // not redirected: it began before the new listener
		{"10.96.0.55:53", "192.168.1.10:40001", false},
		{"10.96.0.56:53", "10.96.0.56:53", false}, // not ours
	} {
		if got := Stale(dsts, ap(tt.orig), ap(tt.reply)); got != tt.stale {
			t.Errorf("Stale(%s, %s) = %v, want %v", tt.orig, tt.reply, got, tt.stale)
		}
	}
}
