package engine

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// backend is a TCP server on loopback that answers each line with its name and the line, and counts its
// connections.
type backend struct {
	name string
	ln   net.Listener
	mu   sync.Mutex
	n    int
}

func newBackend(t *testing.T, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.n++
			b.mu.Unlock()
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", name, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return b
}

func (b *backend) addr() netip.AddrPort { return b.ln.Addr().(*net.TCPAddr).AddrPort() }

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	_ = ln.Close()
	return a
}

func newEngine(t *testing.T, o Options) (*Engine, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	e := New(v1.IPv4Protocol, loopback, o, m)
	t.Cleanup(e.Close)
	return e, m
}

func ensure(t *testing.T, e *Engine, key Key, tg Target) netip.AddrPort {
	t.Helper()
	p, err := e.Ensure(key, tg)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(loopback, p)
}

// ask opens a connection, sends one line and returns the answer's first word (the backend's name).
func ask(t *testing.T, to netip.AddrPort) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", to.String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return askOn(c)
}

func askOn(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	name, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	if rest != "hello" {
		return "", fmt.Errorf("answer %q does not carry the request", line)
	}
	return name, nil
}

var tcpKey = Key{Name: "ns/svc:http", Protocol: v1.ProtocolTCP, Policy: "cluster"}

func TestTCPRoundRobin(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	e, m := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr(), b.addr(), c.addr()}})
	var got []string
	for range 6 {
		name, err := ask(t, svc)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, name)
	}
	if want := "a b c a b c"; strings.Join(got, " ") != want {
		t.Errorf("endpoints chosen: %v, want %s", got, want)
	}
	if n := testutil.ToFloat64(m.accepted.WithLabelValues("TCP")); n != 6 {
		t.Errorf("accepted = %v, want 6", n)
	}
	waitFor(t, "no active connection", func() bool { return testutil.ToFloat64(m.active.WithLabelValues("TCP")) == 0 })
	if n := testutil.ToFloat64(m.bytes.WithLabelValues("TCP", toEndpoint)); n != 6*6 {
		t.Errorf("bytes to endpoints = %v, want 36", n)
	}
}

func TestTCPFailsOverToTheNextEndpoint(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	dead := closedPort(t)
	e, m := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr(), dead, b.addr()}})
	count := map[string]int{}
	for range 30 {
		name, err := ask(t, svc)
		if err != nil {
			t.Fatalf("request failed: %v", err)
		}
		count[name]++
	}
	if count["a"]+count["b"] != 30 || count["a"] < 10 || count["b"] < 10 {
		t.Errorf("answers %v: want all 30 from a and b, both used", count)
	}
	if n := testutil.ToFloat64(m.failedOver.WithLabelValues("TCP")); n != 10 {
		t.Errorf("failed over = %v, want 10 (every third connection starts at the dead endpoint)", n)
	}
	if n := testutil.ToFloat64(m.failed.WithLabelValues("TCP")); n != 0 {
		t.Errorf("failed = %v, want 0", n)
	}
}

func TestTCPNoEndpointReachableResets(t *testing.T) {
	e, m := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{closedPort(t)}})
	if _, err := ask(t, svc); err == nil {
		t.Fatal("request succeeded with no reachable endpoint")
	}
	empty := ensure(t, e, Key{Name: "ns/empty", Protocol: v1.ProtocolTCP}, Target{})
	if _, err := ask(t, empty); err == nil {
		t.Fatal("request succeeded with no endpoints")
	}
	waitFor(t, "two failures", func() bool { return testutil.ToFloat64(m.failed.WithLabelValues("TCP")) == 2 })
}

func TestTCPAffinity(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	e, _ := newEngine(t, Options{})
	tg := Target{Endpoints: []netip.AddrPort{a.addr(), b.addr()}, Affinity: time.Hour}
	svc := ensure(t, e, tcpKey, tg)
	first, err := ask(t, svc)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if name, err := ask(t, svc); err != nil || name != first {
			t.Fatalf("with affinity, got %q (%v), want %q every time", name, err, first)
		}
	}
	// A timeout that has passed sends the client round-robin again.
	tg.Affinity = 50 * time.Millisecond
	ensure(t, e, tcpKey, tg)
	time.Sleep(100 * time.Millisecond)
	seen := map[string]bool{}
	for range 4 {
		name, err := ask(t, svc)
		if err != nil {
			t.Fatal(err)
		}
		seen[name] = true
		time.Sleep(100 * time.Millisecond)
	}
	if len(seen) != 2 {
		t.Errorf("after the affinity timeout, endpoints used: %v, want both", seen)
	}
}

func TestTCPAffinityMovesOffAFailedEndpoint(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	e, _ := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr(), b.addr()}, Affinity: time.Hour})
	first, err := ask(t, svc)
	if err != nil {
		t.Fatal(err)
	}
	if first == "a" {
		_ = a.ln.Close()
	} else {
		_ = b.ln.Close()
	}
	second, err := ask(t, svc)
	if err != nil || second == first {
		t.Fatalf("after %s went away: %q, %v; want the other endpoint", first, second, err)
	}
	for range 3 {
		if name, err := ask(t, svc); err != nil || name != second {
			t.Fatalf("affinity not moved to %s: got %q, %v", second, name, err)
		}
	}
}

func TestTCPHalfClose(t *testing.T) {
	// The backend reads until EOF, then answers with the byte count: it only answers when the client's
	// shutdown(SHUT_WR) reached it through the proxy.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "got %d", n)
	}()
	e, _ := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{ln.Addr().(*net.TCPAddr).AddrPort()}})
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(svc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	payload := strings.Repeat("x", 1<<20)
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("got %d", len(payload)); string(got) != want {
		t.Errorf("answer %q, want %q", got, want)
	}
}

func TestTCPEndpointRemovedDrains(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	e, m := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	long, err := net.Dial("tcp", svc.String())
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	if name, err := askOn(long); err != nil || name != "a" {
		t.Fatalf("first answer %q, %v", name, err)
	}
	ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{b.addr()}})
	if g := testutil.ToFloat64(m.draining.WithLabelValues("TCP")); g != 1 {
		t.Errorf("draining = %v, want 1", g)
	}
	for range 3 {
		if name, err := ask(t, svc); err != nil || name != "b" {
			t.Fatalf("new connection went to %q (%v), want b", name, err)
		}
	}
	// The established connection still works, with its endpoint.
	if name, err := askOn(long); err != nil || name != "a" {
		t.Fatalf("established connection: %q, %v; want a", name, err)
	}
	_ = long.Close()
	waitFor(t, "the drain counted", func() bool {
		return testutil.ToFloat64(m.draining.WithLabelValues("TCP")) == 0 && testutil.ToFloat64(m.drained.WithLabelValues("TCP")) == 1
	})
}

func TestTCPLimits(t *testing.T) {
	a := newBackend(t, "a")
	// Two listeners (a descriptor each) and three connections (two each).
	e, m := newEngine(t, Options{MaxConnsPerListener: 2, Budget: NewBudget(2 + 3*2)})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	other := ensure(t, e, Key{Name: "ns/other", Protocol: v1.ProtocolTCP}, Target{Endpoints: []netip.AddrPort{a.addr()}})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	hold := func(to netip.AddrPort) {
		c, err := net.Dial("tcp", to.String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := askOn(c); err != nil {
			t.Fatalf("connection within the limits: %v", err)
		}
		held = append(held, c)
	}
	hold(svc)
	hold(svc)
	if _, err := ask(t, svc); err == nil {
		t.Error("third connection to one listener succeeded; want it reset (limit 2)")
	}
	hold(other)
	if _, err := ask(t, other); err == nil {
		t.Error("fourth connection in total succeeded; want it reset (limit 3)")
	}
	if n := testutil.ToFloat64(m.refused.WithLabelValues("TCP", limitService)); n != 1 {
		t.Errorf("refused for the listener limit = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.refused.WithLabelValues("TCP", limitTotal)); n != 1 {
		t.Errorf("refused for the total limit = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.active.WithLabelValues("TCP")); n != 3 {
		t.Errorf("active = %v, want 3", n)
	}
	held[0].Close()
	held = held[1:]
	waitFor(t, "a slot freed", func() bool { return testutil.ToFloat64(m.active.WithLabelValues("TCP")) == 2 })
	if _, err := ask(t, svc); err != nil {
		t.Errorf("connection after one ended: %v", err)
	}
}

func TestTCPIdleTimeout(t *testing.T) {
	a := newBackend(t, "a")
	e, _ := newEngine(t, Options{IdleTimeout: 300 * time.Millisecond})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	c, err := net.Dial("tcp", svc.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Traffic every 100 ms keeps it open past the timeout.
	for range 6 {
		if _, err := askOn(c); err != nil {
			t.Fatalf("active connection closed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("idle connection: read returned %v, want it closed", err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("idle connection closed after %v, want about 300ms", d)
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "reset") }

func TestRemoveClosesTheListener(t *testing.T) {
	a := newBackend(t, "a")
	e, m := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	if got := e.Keys(); len(got) != 1 || got[0] != tcpKey {
		t.Fatalf("keys %v", got)
	}
	e.Remove(tcpKey)
	if _, err := net.DialTimeout("tcp", svc.String(), time.Second); err == nil {
		t.Error("listener still accepts after Remove")
	}
	if len(e.Keys()) != 0 || testutil.ToFloat64(m.listeners.WithLabelValues("TCP")) != 0 {
		t.Error("listener still counted after Remove")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func goroutines() int { return runtime.NumGoroutine() }

func counterValue(m *Metrics, dir string) float64 {
	return testutil.ToFloat64(m.bytes.WithLabelValues("TCP", dir))
}

func TestEnsureAtAGivenPort(t *testing.T) {
	a := newBackend(t, "a")
	e, _ := newEngine(t, Options{})
	want := closedPort(t).Port()
	got, err := e.EnsureAt(tcpKey, want, Target{Endpoints: []netip.AddrPort{a.addr()}})
	if err != nil || got != want {
		t.Fatalf("EnsureAt(%d) = %d, %v", want, got, err)
	}
	if name, err := ask(t, netip.AddrPortFrom(loopback, want)); err != nil || name != "a" {
		t.Fatalf("answer on port %d: %q, %v", want, name, err)
	}
	// Another port: the listener moves.
	other := closedPort(t).Port()
	if got, err := e.EnsureAt(tcpKey, other, Target{Endpoints: []netip.AddrPort{a.addr()}}); err != nil || got != other {
		t.Fatalf("EnsureAt(%d) = %d, %v", other, got, err)
	}
	if _, err := net.DialTimeout("tcp", netip.AddrPortFrom(loopback, want).String(), time.Second); err == nil {
		t.Errorf("port %d still listens after the listener moved", want)
	}
	if name, err := ask(t, netip.AddrPortFrom(loopback, other)); err != nil || name != "a" {
		t.Fatalf("answer on port %d: %q, %v", other, name, err)
	}
	// A port someone else holds is an error.
	held, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := e.EnsureAt(Key{Name: "ns/x", Protocol: v1.ProtocolTCP}, uint16(held.Addr().(*net.TCPAddr).Port), Target{Endpoints: []netip.AddrPort{a.addr()}}); err == nil {
		t.Error("EnsureAt on a port in use succeeded")
	}
}

func TestDefaultLimits(t *testing.T) {
	o := Options{Budget: NewBudget(2000)}.withDefaults()
	if o.MaxConnsPerListener != 500 {
		t.Errorf("default per-listener cap %d, want half the connections the budget allows (500)", o.MaxConnsPerListener)
	}
	if o := (Options{Budget: NewBudget(2000), MaxConnsPerListener: -1}).withDefaults(); o.MaxConnsPerListener != -1 {
		t.Errorf("a negative per-listener cap became %d", o.MaxConnsPerListener)
	}
	if o := (Options{}).withDefaults(); o.Budget.Max() < 256 || o.UDPIdleTimeout != 250*time.Millisecond || o.ConnectTimeout != 2*time.Second {
		t.Errorf("defaults %+v", o)
	}
}

// TestBudgetSharedByEngines: two engines (the two families) draw on one budget, listeners included.
func TestBudgetSharedByEngines(t *testing.T) {
	a := newBackend(t, "a")
	b := NewBudget(2 + 2) // two listeners, one connection
	m := NewMetrics(prometheus.NewRegistry())
	e1, e2 := New(v1.IPv4Protocol, loopback, Options{Budget: b}, m), New(v1.IPv4Protocol, loopback, Options{Budget: b}, m)
	defer e1.Close()
	defer e2.Close()
	p1, err := e1.Ensure(tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := e2.Ensure(tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	if err != nil {
		t.Fatal(err)
	}
	held, err := net.Dial("tcp", netip.AddrPortFrom(loopback, p1).String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := askOn(held); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Ensure(Key{Name: "ns/third", Protocol: v1.ProtocolTCP}, Target{Endpoints: []netip.AddrPort{a.addr()}}); err == nil {
		t.Error("a third listener fit in a budget used up by two listeners and one connection")
	}
	if _, err := ask(t, netip.AddrPortFrom(loopback, p2)); err == nil {
		t.Error("the other engine's connection fit in the budget the first one used up")
	}
	held.Close()
	waitFor(t, "the budget back", func() bool { return b.Used() == 2 })
	if _, err := ask(t, netip.AddrPortFrom(loopback, p2)); err != nil {
		t.Errorf("after the first connection ended: %v", err)
	}
}
