package harness

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Target is one address Traffic connects to.
type Target struct{ Network, Addr string }

// Traffic keeps making new connections to its targets, round robin, until stopped, and keeps every
// result: a test proves that a change (a restart, a reload, a handover) loses no connection.
type Traffic struct {
	mu       sync.Mutex
	results  []HitResult
	stopping chan struct{}
	once     sync.Once
	done     chan struct{}
}

// StartTraffic starts connections from ns to the targets in a loop: each round makes 4 new connections
// to every target, 4 at a time, each with a 2 s timeout. Call Stop to end it.
func StartTraffic(from *NetNS, targets []Target) *Traffic {
	tr := &Traffic{stopping: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for {
			for _, tg := range targets {
				select {
				case <-tr.stopping:
					return
				default:
				}
				res, _ := HitWith(context.Background(), from, tg.Network, tg.Addr, 4, HitOptions{Concurrency: 4, Timeout: 2 * time.Second})
				tr.mu.Lock()
				tr.results = append(tr.results, res...)
				tr.mu.Unlock()
			}
		}
	}()
	return tr
}

// Count returns how many connections have completed.
func (tr *Traffic) Count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.results)
}

// WaitFor waits (a minute at most) until at least n connections have completed.
func (tr *Traffic) WaitFor(t testing.TB, n int) {
	t.Helper()
	Eventually(t, strconv.Itoa(n)+" connections", time.Minute, func() (bool, string) {
		c := tr.Count()
		return c >= n, strconv.Itoa(c) + " so far"
	})
}

// WaitMore waits for n more connections than have completed so far.
func (tr *Traffic) WaitMore(t testing.TB, n int) {
	t.Helper()
	tr.WaitFor(t, tr.Count()+n)
}

// Stop ends the loop once the connections under way are done (2 s at most), so that every connection
// made is in the results, and returns them. It is idempotent.
func (tr *Traffic) Stop() []HitResult {
	tr.once.Do(func() { close(tr.stopping) })
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.results
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
