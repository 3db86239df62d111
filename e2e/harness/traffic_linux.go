package harness

import (
	"net"
	"strings"
	"testing"
	"time"

	"kube-proxy/e2e/probe"
)

// Target is one address Traffic connects to (probe.Target).
type Target = probe.Target

// Traffic keeps making new connections to its targets, round robin, until stopped, and keeps every
// result: a test proves that a change (a restart, a reload, a handover) loses no connection. It is a
// probe.Traffic whose waits fail a test.
type Traffic struct {
	*probe.Traffic
}

// StartTraffic starts connections from ns to the targets in a loop: each round makes 4 new connections
// to every target, 4 at a time, each with a 2 s timeout. Call Stop to end it.
func StartTraffic(from *NetNS, targets []Target) *Traffic {
	return &Traffic{probe.StartTraffic(dialer(from), targets)}
}

// WaitFor waits (a minute at most) until at least n connections have completed, failing t otherwise.
func (tr *Traffic) WaitFor(t testing.TB, n int) {
	t.Helper()
	if err := tr.Traffic.WaitFor(n, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// WaitMore waits for n more connections than have completed so far.
func (tr *Traffic) WaitMore(t testing.TB, n int) {
	t.Helper()
	tr.WaitFor(t, tr.Count()+n)
}

// UDPFlow is one UDP socket in a namespace, connected to an address: every datagram it sends belongs to
// the same conntrack entry, so it shows where a flow goes (and when conntrack cleanup moves it).
type UDPFlow struct {
	conn net.Conn
}

// NewUDPFlow opens a UDP socket in from connected to addr; it is closed when t ends.
func NewUDPFlow(t testing.TB, from *NetNS, addr string) *UDPFlow {
	t.Helper()
	var conn net.Conn
	err := from.Do(func() error {
		var err error
		conn, err = net.Dial("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("UDP socket to %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &UDPFlow{conn: conn}
}

// Ask sends one datagram and returns the name of the pod that answered ("" when none did within 1 s).
func (u *UDPFlow) Ask() string {
	_ = u.conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := u.conn.Write([]byte("hit\n")); err != nil {
		return ""
	}
	buf := make([]byte, 512)
	n, err := u.conn.Read(buf)
	if err != nil {
		return ""
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
