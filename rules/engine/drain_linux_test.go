package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
)

// slowTCP is a TCP backend that answers each line with its name and the line after delay.
func slowTCP(t *testing.T, name string, delay time.Duration) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					time.Sleep(delay)
					if _, err := fmt.Fprintf(c, "%s %s\n", name, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// send writes a line on a new connection to addr and returns a function that reads the answer's first
// word and closes the connection.
func send(t *testing.T, addr netip.AddrPort) func() (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr.String(), time.Second)
	if err != nil {
		t.Fatalf("connecting to %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		t.Fatal(err)
	}
	return func() (string, error) {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		name, _, _ := strings.Cut(line, " ")
		return name, err
	}
}

// TestDrain: at stop the engine takes no new connection or datagram, lets those under way finish, and
// returns once they have. With a store, what arrives meanwhile waits for the next process, which serves
// it; without one it is refused. A connection that does not end in time is counted as cut short.
func TestDrain(t *testing.T) {
	const delay = 300 * time.Millisecond
	tcpEP, udpEP := slowTCP(t, "a", delay), udpBackendAfter(t, "u", delay)
	store := newFakeStore(t)
	opts := Options{Sockets: store, UDPIdleTimeout: time.Second}
	e := New(v1.IPv4Protocol, loopback, opts, NewMetrics(prometheus.NewRegistry()))
	t.Cleanup(e.Close)
	tcpSvc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{tcpEP}})
	udpSvc := ensure(t, e, udpSvcKey, Target{Endpoints: []netip.AddrPort{udpEP}})

	inFlight := send(t, tcpSvc)
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.WriteToUDPAddrPort([]byte("q"), udpSvc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the connection and the flow to be under way", func() bool {
		return listenerOf(e, tcpKey).inFlight() == 1 && listenerOf(e, udpSvcKey).inFlight() == 1
	})

	drained := make(chan int64, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		drained <- e.Drain(ctx)
	}()
	waitFor(t, "the engine to stop taking connections", func() bool {
		l := listenerOf(e, tcpKey).(*tcpListener)
		select {
		case <-l.done:
			return true
		default:
			return false
		}
	})
	// Arrives while draining: queued in the stored socket, not served by this process.
	queued := send(t, tcpSvc)
	if _, err := client.WriteToUDPAddrPort([]byte("later"), udpSvc); err != nil {
		t.Fatal(err)
	}

	if name, err := inFlight(); err != nil || name != "a" {
		t.Fatalf("the connection under way at the stop: %q, %v", name, err)
	}
	buf := make([]byte, 512)
	_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, _, err := client.ReadFromUDPAddrPort(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "u ") || !strings.HasSuffix(string(buf[:n]), " q") {
		t.Fatalf("the UDP exchange under way at the stop: %q, %v", buf[:n], err)
	}
	select {
	case left := <-drained:
		if left != 0 {
			t.Errorf("Drain left %d under way, want 0", left)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("Drain took %v", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return once everything under way had ended")
	}

	// The next process serves what waited.
	e.Close()
	store.restart(t)
	next := New(v1.IPv4Protocol, loopback, opts, NewMetrics(prometheus.NewRegistry()))
	t.Cleanup(next.Close)
	ensure(t, next, tcpKey, Target{Endpoints: []netip.AddrPort{tcpEP}})
	ensure(t, next, udpSvcKey, Target{Endpoints: []netip.AddrPort{udpEP}})
	if name, err := queued(); err != nil || name != "a" {
		t.Fatalf("the connection made while draining, after the restart: %q, %v", name, err)
	}
	_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, _, err := client.ReadFromUDPAddrPort(buf); err != nil || !strings.HasSuffix(string(buf[:n]), " later") {
		t.Fatalf("the datagram sent while draining, after the restart: %q, %v", buf[:n], err)
	}

	// Without a store, a connection made while draining is refused. A kept-alive connection, quiet since its
	// endpoint answered, and an answered UDP exchange whose flow has not idled out yet do not hold the drain
	// up; a request that waits for its answer does, until the deadline, and is reported cut short.
	slow := slowTCP(t, "s", time.Minute)
	plain := New(v1.IPv4Protocol, loopback, Options{UDPIdleTimeout: time.Hour}, NewMetrics(prometheus.NewRegistry()))
	t.Cleanup(plain.Close)
	svc := ensure(t, plain, tcpKey, Target{Endpoints: []netip.AddrPort{tcpEP}})
	kept, err := net.Dial("tcp", svc.String())
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	if name, err := askOn(kept); err != nil || name != "a" {
		t.Fatalf("a kept-alive connection: %q, %v", name, err)
	}
	exchange(t, client, ensure(t, plain, udpSvcKey, Target{Endpoints: []netip.AddrPort{udpBackend(t, "b")}}), "answered")
	time.Sleep(2 * drainQuiet)
	if n := listenerOf(plain, udpSvcKey).(*udpListener).n.Load(); n != 1 {
		t.Fatalf("%d UDP flows before the drain, want the answered one", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if left := plain.Drain(ctx); left != 0 || time.Since(start) > 200*time.Millisecond {
		t.Errorf("Drain with a quiet kept-alive connection: %d left after %v; want 0 at once", left, time.Since(start))
	}
	if _, err := net.DialTimeout("tcp", svc.String(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("without a store, a connection once drained: %v, want refused", err)
	}

	waiting := engineWithStore(t, nil)
	svc = ensure(t, waiting, tcpKey, Target{Endpoints: []netip.AddrPort{slow}})
	_ = send(t, svc)
	waitFor(t, "the request to be under way", func() bool { return listenerOf(waiting, tcpKey).inFlight() == 1 })
	time.Sleep(2 * drainQuiet)
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if left := waiting.Drain(ctx); left != 1 {
		t.Errorf("Drain with a request waiting for its answer left %d under way, want 1", left)
	}
}

func listenerOf(e *Engine, key Key) listener {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.listeners[key]
}
