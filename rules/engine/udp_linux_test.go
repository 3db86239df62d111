package engine

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// udpBackend answers each datagram with its name, the sender's address and the datagram.
func udpBackend(t *testing.T, name string) netip.AddrPort { return udpBackendAfter(t, name, 0) }

// udpBackendAfter is udpBackend answering after delay.
func udpBackendAfter(t *testing.T, name string, delay time.Duration) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			answer := []byte(name + " " + from.String() + " " + string(buf[:n]))
			time.AfterFunc(delay, func() { _, _ = c.WriteToUDPAddrPort(answer, from) })
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

var udpKey = Key{Name: "ns/dns:dns", Protocol: v1.ProtocolUDP, Policy: "cluster"}

// exchange sends msg from c to svc and returns the answer; it checks that the answer came from svc.
func exchange(t *testing.T, c *net.UDPConn, svc netip.AddrPort, msg string) []string {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort([]byte(msg), svc); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 2048)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer to %q: %v", msg, err)
	}
	if from != svc {
		t.Errorf("answer came from %s, want %s", from, svc)
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) != 3 || f[2] != msg {
		t.Fatalf("answer %q does not carry %q", buf[:n], msg)
	}
	return f
}

func TestUDPFlowsPerClient(t *testing.T) {
	a, b := udpBackend(t, "a"), udpBackend(t, "b")
	e, m := newEngine(t, Options{UDPIdleTimeout: 200 * time.Millisecond})
	svc := ensure(t, e, udpKey, Target{Endpoints: []netip.AddrPort{a, b}})

	c1, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()

	// One client's packets share one flow: one endpoint, one upstream source port.
	first := exchange(t, c1, svc, "q1")
	for i := range 5 {
		got := exchange(t, c1, svc, "q"+string(rune('2'+i)))
		if got[0] != first[0] || got[1] != first[1] {
			t.Fatalf("packet %d went %v, first went %v: want the same flow", i+2, got[:2], first[:2])
		}
	}
	// Another client gets its own flow, to the next endpoint.
	other := exchange(t, c2, svc, "r1")
	if other[0] == first[0] {
		t.Errorf("second client went to %s too; want round-robin to the other endpoint", other[0])
	}
	if n := testutil.ToFloat64(m.accepted.WithLabelValues("UDP")); n != 2 {
		t.Errorf("flows accepted = %v, want 2", n)
	}
	if n := testutil.ToFloat64(m.active.WithLabelValues("UDP")); n != 2 {
		t.Errorf("flows active = %v, want 2", n)
	}
	// Idle flows expire; the client's next packet starts a new flow.
	waitFor(t, "idle flows expired", func() bool { return testutil.ToFloat64(m.active.WithLabelValues("UDP")) == 0 })
	again := exchange(t, c1, svc, "q9")
	if again[1] == first[1] {
		t.Errorf("after expiry the flow kept its upstream socket %s", first[1])
	}
	if n := testutil.ToFloat64(m.bytes.WithLabelValues("UDP", toEndpoint)); n != 16 {
		t.Errorf("bytes to endpoints = %v, want 16", n)
	}
}

func TestUDPEndpointRemovedEndsItsFlows(t *testing.T) {
	a, b := udpBackend(t, "a"), udpBackend(t, "b")
	e, m := newEngine(t, Options{UDPIdleTimeout: time.Hour})
	svc := ensure(t, e, udpKey, Target{Endpoints: []netip.AddrPort{a}})
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := exchange(t, c, svc, "x"); got[0] != "a" {
		t.Fatalf("went to %s", got[0])
	}
	ensure(t, e, udpKey, Target{Endpoints: []netip.AddrPort{b}})
	if got := exchange(t, c, svc, "y"); got[0] != "b" {
		t.Fatalf("after a was removed, went to %s; want b", got[0])
	}
	if n := testutil.ToFloat64(m.active.WithLabelValues("UDP")); n != 1 {
		t.Errorf("flows active = %v, want 1", n)
	}
	e.Remove(udpKey)
	if n := testutil.ToFloat64(m.active.WithLabelValues("UDP")); n != 0 {
		t.Errorf("flows active after Remove = %v, want 0", n)
	}
}

func TestUDPManyIdleFlowsNoGoroutines(t *testing.T) {
	a := udpBackend(t, "a")
	e, m := newEngine(t, Options{UDPIdleTimeout: time.Hour})
	svc := ensure(t, e, udpKey, Target{Endpoints: []netip.AddrPort{a}})
	before := goroutines()
	var conns []*net.UDPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 200 {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		exchange(t, c, svc, "z")
	}
	if n := testutil.ToFloat64(m.active.WithLabelValues("UDP")); n != 200 {
		t.Fatalf("flows active = %v, want 200", n)
	}
	if after := goroutines(); after > before+5 {
		t.Errorf("goroutines %d -> %d with 200 idle flows; want no goroutine per flow", before, after)
	}
}

func TestUDPIPv6(t *testing.T) {
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort([]byte("six "+from.String()+" "+string(buf[:n])), from)
		}
	}()
	m := NewMetrics(prometheus.NewRegistry())
	e := New(v1.IPv6Protocol, netip.IPv6Loopback(), Options{}, m)
	defer e.Close()
	p, err := e.Ensure(udpKey, Target{Endpoints: []netip.AddrPort{c.LocalAddr().(*net.UDPAddr).AddrPort()}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if got := exchange(t, client, netip.AddrPortFrom(netip.IPv6Loopback(), p), "q"); got[0] != "six" {
		t.Fatalf("answer %v", got)
	}
}

// TestUDPListenersShareOnePoller: a UDP listener costs its socket and its reader goroutine; the epoll set
// and its goroutine are the engine's, made once.
func TestUDPListenersShareOnePoller(t *testing.T) {
	a := udpBackend(t, "a")
	e, _ := newEngine(t, Options{})
	fds := func() int {
		d, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(d)
	}
	ensure(t, e, Key{Name: "ns/first", Protocol: v1.ProtocolUDP}, Target{Endpoints: []netip.AddrPort{a}})
	beforeFDs, beforeG := fds(), goroutines()
	const n = 50
	for i := range n {
		ensure(t, e, Key{Name: fmt.Sprintf("ns/s%d", i), Protocol: v1.ProtocolUDP}, Target{Endpoints: []netip.AddrPort{a}})
	}
	if d := fds() - beforeFDs; d != n {
		t.Errorf("%d UDP listeners took %d descriptors, want %d", n, d, n)
	}
	if d := goroutines() - beforeG; d > n+2 {
		t.Errorf("%d UDP listeners took %d goroutines, want %d", n, d, n)
	}
}

// TestUDPFlowOpenedAcrossASync: a flow opened while a sync replaces the endpoints (the reader took its
// endpoint before the sync, registers the flow after the sync's sweep of the flows) is not kept: the
// client would stay on the removed endpoint for as long as it keeps sending. The datagram goes to a
// current endpoint instead.
func TestUDPFlowOpenedAcrossASync(t *testing.T) {
	a, b := udpBackend(t, "a"), udpBackend(t, "b")
	e, m := newEngine(t, Options{UDPIdleTimeout: time.Hour})
	ensure(t, e, udpKey, Target{Endpoints: []netip.AddrPort{a}})
	l := listenerOf(e, udpKey).(*udpListener)
	client := netip.MustParseAddrPort("127.0.0.1:40053")
	now := time.Now()
	order := l.bal.order(client.Addr(), now)                     // the reader picks a...
	ensure(t, e, udpKey, Target{Endpoints: []netip.AddrPort{b}}) // ...a sync replaces it...
	f, stale := l.openFlow(client, loopback, order, now)         // ...and the reader opens the flow.
	if f != nil {
		t.Fatalf("openFlow with an endpoint the sync removed opened a flow to %s; want none", f.ep)
	}
	if !stale {
		t.Fatal("openFlow with an endpoint the sync removed did not report it stale")
	}
	l.mu.Lock()
	kept := l.flows[client]
	l.mu.Unlock()
	if kept != nil {
		t.Fatalf("a flow to %s was kept", kept.ep)
	}

	// Through the reader's whole path: the datagram opens a flow to the current endpoint.
	if f := l.flow(client, unix.PktInfo4(&unix.Inet4Pktinfo{Addr: loopback.As4()})); f == nil || f.ep != b {
		t.Fatalf("flow after the sync = %v, want one to b (%s)", f, b)
	}
	if n := testutil.ToFloat64(m.failed.WithLabelValues("UDP")); n != 0 {
		t.Errorf("failed flows = %v, want 0", n)
	}
}
