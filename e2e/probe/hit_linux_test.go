package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestClassify(t *testing.T) {
	sysErr := func(e syscall.Errno) error { return &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", e)} }
	tests := []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("read: %w", os.ErrDeadlineExceeded), "timeout"},
		{sysErr(syscall.ECONNREFUSED), "refused"},
		{sysErr(syscall.ECONNRESET), "reset"},
		{sysErr(syscall.EHOSTUNREACH), "host-unreachable"},
		{sysErr(syscall.ENETUNREACH), "net-unreachable"},
		{sysErr(syscall.EACCES), "denied"},
		{io.EOF, "eof"},
		{errors.New("something"), "other"},
	}
	for _, tt := range tests {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("classify(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestCountAndFormatHits(t *testing.T) {
	res := []HitResult{{Pod: "pod2"}, {Pod: "pod1"}, {Err: "timeout"}, {Pod: "pod2"}}
	got := CountHits(res)
	if diff := cmp.Diff(map[string]int{"pod1": 1, "pod2": 2, "ERR:timeout": 1}, got); diff != "" {
		t.Errorf("CountHits (-want +got):\n%s", diff)
	}
	if s := FormatHits(got); s != "ERR:timeout=1 pod1=1 pod2=2" {
		t.Errorf("FormatHits = %q", s)
	}
}

// podLike serves TCP on 127.0.0.1 as a pod server does: it reads the request and answers
// "<name> <client addr>"; answer overrides the answer (closing at once when it is "").
func podLike(t *testing.T, name string, answer func(client string) string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				a := name + " " + c.RemoteAddr().String() + "\n"
				if answer != nil {
					a = answer(c.RemoteAddr().String())
				}
				_, _ = io.WriteString(c, a)
			}()
		}
	}()
	return l.Addr().String()
}

func TestHitWithTCP(t *testing.T) {
	addr := podLike(t, "pod1", nil)
	res, err := HitWith(context.Background(), nil, "tcp", addr, 20, HitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatHits(CountHits(res)); got != "pod1=20" {
		t.Fatalf("hits: %s", got)
	}
	for _, r := range res {
		if r.Seen != r.Local {
			t.Errorf("the server saw %s, the client was %s", r.Seen, r.Local)
		}
	}
}

func TestHitWithUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte("pod2 "+from.String()+"\n"), from)
		}
	}()
	res, err := HitWith(context.Background(), nil, "udp", pc.LocalAddr().String(), 10, HitOptions{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]bool{}
	for _, r := range res {
		ports[r.Local] = true
	}
	if got := FormatHits(CountHits(res)); got != "pod2=10" || len(ports) != 10 {
		t.Errorf("hits %s from %d source addresses, want pod2=10 from 10", got, len(ports))
	}
}

func TestHitWithFailures(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	// A listener that never accepts still completes the handshake (backlog); its answer never comes.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	tests := []struct {
		addr string
		opts HitOptions
		want string
	}{
		{refused, HitOptions{}, "ERR:refused=3"},
		{podLike(t, "x", func(string) string { return "" }), HitOptions{}, "ERR:eof=3"},
		{podLike(t, "x", func(string) string { return "one two three\n" }), HitOptions{}, "ERR:garbled=3"},
		{silent.Addr().String(), HitOptions{Timeout: 100 * time.Millisecond}, "ERR:timeout=3"},
	}
	for _, tc := range tests {
		res, err := HitWith(context.Background(), nil, "tcp", tc.addr, 3, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatHits(CountHits(res)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.addr, got, tc.want)
		}
	}
	if _, err := HitWith(context.Background(), nil, "sctp", refused, 1, HitOptions{}); err == nil {
		t.Error("network sctp: no error")
	}
}

func TestHitWithDialer(t *testing.T) {
	addr := podLike(t, "pod3", nil)
	var dials int
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		dials++
		if a != "elsewhere:80" {
			return nil, fmt.Errorf("dialled %s", a)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	res, err := HitWith(context.Background(), dial, "tcp", "elsewhere:80", 4, HitOptions{Concurrency: 1})
	if err != nil || dials != 4 || FormatHits(CountHits(res)) != "pod3=4" {
		t.Errorf("through the dialer: %d dials, %s, %v", dials, FormatHits(CountHits(res)), err)
	}
}

func TestHitWithContextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := HitWith(ctx, nil, "tcp", podLike(t, "pod1", nil), 100, HitOptions{Concurrency: 1})
	if !errors.Is(err, context.Canceled) || len(res) == 100 {
		t.Errorf("ended context: %d results, %v", len(res), err)
	}
}

func TestTraffic(t *testing.T) {
	a, b := podLike(t, "pod1", nil), podLike(t, "pod2", nil)
	tr := StartTraffic(nil, []Target{{"tcp", a}, {"tcp", b}})
	if err := tr.WaitFor(20, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := tr.WaitFor(1<<30, 150*time.Millisecond); err == nil {
		t.Error("WaitFor of more connections than can be made returned nil")
	}
	res := tr.Stop()
	if again := tr.Stop(); len(again) != len(res) {
		t.Errorf("a second Stop: %d results, the first %d", len(again), len(res))
	}
	counts := CountHits(res)
	if len(res)%4 != 0 || counts["pod1"] == 0 || counts["pod2"] == 0 || counts["pod1"]+counts["pod2"] != len(res) {
		t.Errorf("traffic: %d connections, %s; want rounds of 4, all answered by both", len(res), FormatHits(counts))
	}
	if tr.Count() != len(res) {
		t.Errorf("Count %d after Stop, %d results", tr.Count(), len(res))
	}
}
