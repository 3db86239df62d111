package engine

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestIdleConnectionsHoldTwoDescriptors: an idle proxied connection costs the engine its two sockets and
// nothing more (io.Copy's splice kept a pipe per direction: six).
func TestIdleConnectionsHoldTwoDescriptors(t *testing.T) {
	a := newBackend(t, "a")
	e, _ := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{a.addr()}})
	count := func() int {
		d, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(d)
	}
	before := count()
	const n = 200
	var cs []net.Conn
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", svc.String())
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		if _, err := askOn(c); err != nil { // data has flowed both ways; now it idles
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	// Per connection: the test's client socket and the backend's, plus the engine's.
	perConn := float64(count()-before)/n - 2
	if perConn > 2.1 {
		t.Errorf("the engine holds %.2f descriptors per idle connection, want 2", perConn)
	}
}

// TestStreamBothWaysIntact sends 32 MiB of random bytes each way at once through the engine to a backend
// that echoes them, and compares checksums.
func TestStreamBothWaysIntact(t *testing.T) {
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
		_, _ = io.Copy(c, c)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	e, m := newEngine(t, Options{})
	svc := ensure(t, e, tcpKey, Target{Endpoints: []netip.AddrPort{ln.Addr().(*net.TCPAddr).AddrPort()}})
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(svc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	data := make([]byte, 32<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, bytes.NewReader(data))
		if err == nil {
			err = c.CloseWrite()
		}
		sent <- err
	}()
	got := sha256.New()
	n, err := io.Copy(got, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256(data); n != int64(len(data)) || !bytes.Equal(got.Sum(nil), want[:]) {
		t.Fatalf("echo of %d bytes came back as %d bytes with another checksum", len(data), n)
	}
	waitFor(t, "the byte counts", func() bool {
		return m.bytes.WithLabelValues("TCP", toEndpoint) != nil &&
			counterValue(m, toEndpoint) == float64(len(data)) && counterValue(m, toClient) == float64(len(data))
	})
}
