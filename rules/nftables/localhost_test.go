package nftables

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	pt "kube-proxy/proxy/proxytest"
	"kube-proxy/rules/internal/metricstest"
)

// TestLocalhostProxySwitchConverges turns the localhost proxy on and off again by a reload (nodePortAddresses
// gaining and losing loopback) and checks that each partial sync leaves exactly the table a rebuild writes:
// the TCP reject chain, counter and elements go, and come back.
func TestLocalhostProxySwitchConverges(t *testing.T) {
	addrs := []string{"10.0.0.1", "127.0.0.1"}
	reject := testConfig(v4, "10.244.0.0/16")
	reject.LocalhostReject = true
	served := reject
	served.LocalhostProxy = true
	d, k := testDataplane(reject, addrs...)
	s := richSnapshot(v4)
	apply(t, d, s, true)
	for i, cfg := range []Config{served, reject} {
		d.mu.Lock()
		d.cfg, d.renderer, d.diffAll = cfg, newRenderer(cfg), true
		d.mu.Unlock()
		apply(t, d, s, false)
		want := rebuilt(t, cfg, s, addrs...)
		if diff := cmp.Diff(want, dump(k)); diff != "" {
			t.Fatalf("switch %d: partial sync differs from a rebuild (-rebuild +partial):\n%s", i, diff)
		}
		if has := strings.Contains(dump(k), "localhost-nodeport-reject-tcp"); has == cfg.LocalhostProxy {
			t.Errorf("switch %d (proxy %v): TCP reject chain present = %v", i, cfg.LocalhostProxy, has)
		}
	}
}

// TestLocalhostProxyServesTCPNodePorts: the listener on 127.0.0.1:<nodePort> forwards to the Service's
// endpoints (here a loopback server), follows them, and closes when the Service has none for its
// external policy or the proxy is turned off.
func TestLocalhostProxyServesTCPNodePorts(t *testing.T) {
	backend, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "backend\n")
			c.Close()
		}
	}()
	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nodePort := int32(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	ep := backend.Addr().(*net.TCPAddr).AddrPort().String()

	p := newLocalhostProxy(v1.IPv4Protocol, NewMetrics(nil, true).localhostFor(v1.IPv4Protocol))
	defer p.e.Close()
	web := pt.Port("ns/web", "", v1.ProtocolTCP, "10.96.0.10", 80, pt.NodePort(nodePort), pt.Endpoints(ep))
	dns := pt.Port("ns/dns", "", v1.ProtocolUDP, "10.96.0.53", 53, pt.NodePort(nodePort), pt.Endpoints("127.0.0.1:53"))
	p.sync(pt.Snapshot(v1.IPv4Protocol, pt.Node("10.0.0.1"), web, dns), true)
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(nodePort)).String()
	if got := answer(t, addr); got != "backend" {
		t.Fatalf("127.0.0.1:%d answered %q, want the backend", nodePort, got)
	}
	if keys := p.e.Keys(); len(keys) != 1 {
		t.Errorf("listeners %v: want one, for the TCP NodePort only", keys)
	}
	// externalTrafficPolicy Local without a local endpoint: nothing listens.
	local := pt.Port("ns/web", "", v1.ProtocolTCP, "10.96.0.10", 80, pt.NodePort(nodePort), pt.ExternalLocal(32000), pt.Endpoints(ep))
	p.sync(pt.Snapshot(v1.IPv4Protocol, pt.Node("10.0.0.1"), local), true)
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("a Local-policy NodePort without local endpoints still listens on localhost")
	}
	p.sync(pt.Snapshot(v1.IPv4Protocol, pt.Node("10.0.0.1"), web), true)
	if got := answer(t, addr); got != "backend" {
		t.Fatalf("after the endpoints came back: %q", got)
	}
	p.sync(pt.Snapshot(v1.IPv4Protocol, pt.Node("10.0.0.1"), web), false)
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("the proxy turned off still listens")
	}
}

func answer(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from %s: %v", addr, err)
	}
	return strings.TrimSpace(line)
}

func TestHasLoopback(t *testing.T) {
	for _, tc := range []struct {
		list []string
		want bool
	}{
		{[]string{"localhost"}, true},
		{[]string{"primary", "127.0.0.0/8"}, true},
		{[]string{"primary"}, false},
		{[]string{"0.0.0.0/0"}, false}, // all addresses, but loopback is not listed explicitly
		{nil, false},
	} {
		if got := hasLoopback(proxy.ParseNodePortAddresses(tc.list, v1.IPv4Protocol)); got != tc.want {
			t.Errorf("hasLoopback(%v) = %v, want %v", tc.list, got, tc.want)
		}
	}
}

// TestLocalhostProxyIPv6 serves a TCP NodePort on [::1].
func TestLocalhostProxyIPv6(t *testing.T) {
	backend, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "six\n")
			c.Close()
		}
	}()
	free, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	nodePort := int32(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	p := newLocalhostProxy(v1.IPv6Protocol, NewMetrics(nil, true).localhostFor(v1.IPv6Protocol))
	defer p.e.Close()
	web := pt.Port("ns/web", "", v1.ProtocolTCP, "fd00:96::10", 80, pt.NodePort(nodePort),
		pt.Endpoints(backend.Addr().(*net.TCPAddr).AddrPort().String()))
	p.sync(pt.Snapshot(v1.IPv6Protocol, proxy.Node{Name: pt.NodeName}, web), true)
	if got := answer(t, netip.AddrPortFrom(netip.IPv6Loopback(), uint16(nodePort)).String()); got != "six" {
		t.Fatalf("[::1]:%d answered %q", nodePort, got)
	}
}

// TestLocalhostProxyListenerMetrics: kubeproxy_nftables_localhost_nodeport_listeners counts the listeners
// open (none reported before the proxy first runs, 0 once it is off) and
// ..._listener_creation_failures_total the NodePorts that could not be served, here one whose port another
// program holds on 127.0.0.1.
func TestLocalhostProxyListenerMetrics(t *testing.T) {
	freePort := func() (int32, net.Listener) {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return int32(l.Addr().(*net.TCPAddr).Port), l
	}
	p1, l1 := freePort()
	p2, l2 := freePort()
	l1.Close()
	l2.Close()
	taken, holder := freePort() // stays open: the proxy cannot listen there
	defer holder.Close()

	reg := prometheus.NewPedanticRegistry()
	p := newLocalhostProxy(v1.IPv4Protocol, NewMetrics(reg, true).localhostFor(v1.IPv4Protocol))
	defer p.e.Close()
	values := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for k, v := range metricstest.Values(t, reg, "kubeproxy_nftables_localhost_nodeport_") {
			name, labels, _ := strings.Cut(strings.TrimPrefix(k, "kubeproxy_nftables_localhost_nodeport_"), "{")
			if labels != `ip_family="IPv4"}` {
				t.Errorf("%s: want the label ip_family=IPv4 only", k)
			}
			out[name] = v
		}
		return out
	}
	if got := values(); len(got) != 0 {
		t.Errorf("before the first sync: %v, want nothing", got)
	}
	svc := func(name string, np int32) *proxy.ServicePort {
		return pt.Port("ns/"+name, "", v1.ProtocolTCP, "10.96.0.10", 80, pt.NodePort(np), pt.Endpoints("10.244.1.2:8080"))
	}
	for _, step := range []struct {
		name string
		svcs []*proxy.ServicePort
		on   bool
		want map[string]float64
	}{
		{"two NodePorts", []*proxy.ServicePort{svc("a", p1), svc("b", p2)}, true,
			map[string]float64{"listeners": 2}},
		{"a third one's port is taken", []*proxy.ServicePort{svc("a", p1), svc("b", p2), svc("c", taken)}, true,
			map[string]float64{"listeners": 2, "listener_creation_failures_total": 1}},
		{"the same again: still failing", []*proxy.ServicePort{svc("a", p1), svc("b", p2), svc("c", taken)}, true,
			map[string]float64{"listeners": 2, "listener_creation_failures_total": 2}},
		{"one gone", []*proxy.ServicePort{svc("a", p1)}, true,
			map[string]float64{"listeners": 1, "listener_creation_failures_total": 2}},
		{"proxy off", []*proxy.ServicePort{svc("a", p1)}, false,
			map[string]float64{"listeners": 0, "listener_creation_failures_total": 2}},
	} {
		p.sync(pt.Snapshot(v1.IPv4Protocol, pt.Node("10.0.0.1"), step.svcs...), step.on)
		if got := values(); !cmp.Equal(got, step.want) {
			t.Errorf("%s: %v, want %v", step.name, got, step.want)
		}
	}
}
