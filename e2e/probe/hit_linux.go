package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// HitResult is the outcome of one connection made by HitWith.
type HitResult struct {
	// Pod is the name the answering pod server gave; empty on error.
	Pod string
	// Seen is the client address as the pod saw it ("ip:port"): the client's own address unless
	// the connection was SNATed on the way.
	Seen string
	// Local is the client socket's local address.
	Local string
	// Err is empty on success, else a short class: "timeout", "refused", "reset", "host-unreachable",
	// "net-unreachable", "denied", "eof" (closed without an answer), "garbled" or "other".
	Err string
	// Detail is the full error text when Err is set.
	Detail string
}

// HitOptions tunes HitWith.
type HitOptions struct {
	// Timeout bounds each connection (connect, request and answer); default 2 s.
	Timeout time.Duration
	// Concurrency is how many connections are in flight at once; default 8.
	Concurrency int
}

// Dialer makes a connection as net.Dialer.DialContext does; a harness namespace's DialContext makes it
// from inside that namespace.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// CountHits counts results by pod name, failures under "ERR:<class>".
func CountHits(results []HitResult) map[string]int {
	m := map[string]int{}
	for _, r := range results {
		if r.Err != "" {
			m["ERR:"+r.Err]++
		} else {
			m[r.Pod]++
		}
	}
	return m
}

// FormatHits renders counts as "pod1=3 pod2=5 ERR:timeout=1", sorted, for messages.
func FormatHits(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// HitWith makes n new connections with dial (nil: from this process's namespace) to addr and returns
// each one's result, in no particular order. network is "tcp", "tcp4", "tcp6", "udp", "udp4" or "udp6".
// For TCP each connection is fresh and carries one request; for UDP each datagram goes from a new socket,
// hence a new source port. If ctx ends early it returns the results of the connections made so far with
// the error; the error is for the caller's side failing, never for a failed connection.
func HitWith(ctx context.Context, dial Dialer, network, addr string, n int, opts HitOptions) ([]HitResult, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	var udp bool
	switch network {
	case "tcp", "tcp4", "tcp6":
	case "udp", "udp4", "udp6":
		udp = true
	default:
		return nil, fmt.Errorf("hit: unsupported network %q", network)
	}
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	results := make([]HitResult, n)
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(opts.Concurrency, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				results[i] = hitOnce(ctx, dial, network, addr, udp, opts.Timeout)
			}
		}()
	}
	var err error
	sent := 0
feed:
	for ; sent < n; sent++ {
		select {
		case work <- sent:
		case <-ctx.Done():
			err = fmt.Errorf("hit %s %s: %w", network, addr, ctx.Err())
			break feed
		}
	}
	close(work)
	wg.Wait()
	return results[:sent], err
}

func hitOnce(ctx context.Context, dial Dialer, network, addr string, udp bool, timeout time.Duration) HitResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dial(ctx, network, addr)
	if err != nil {
		return failed(err)
	}
	defer conn.Close()
	r := HitResult{Local: conn.LocalAddr().String()}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte("hit\n")); err != nil {
		return withLocal(failed(err), r.Local)
	}
	var answer []byte
	if udp {
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		if err != nil {
			return withLocal(failed(err), r.Local)
		}
		answer = buf[:n]
	} else {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		answer, err = io.ReadAll(io.LimitReader(conn, 512))
		if err != nil {
			return withLocal(failed(err), r.Local)
		}
		if len(answer) == 0 {
			return HitResult{Local: r.Local, Err: "eof", Detail: "connection closed without an answer"}
		}
	}
	fields := strings.Fields(string(answer))
	if len(fields) != 2 {
		return HitResult{Local: r.Local, Err: "garbled", Detail: fmt.Sprintf("answer %q", answer)}
	}
	r.Pod, r.Seen = fields[0], fields[1]
	return r
}

func withLocal(r HitResult, local string) HitResult {
	r.Local = local
	return r
}

func failed(err error) HitResult {
	return HitResult{Err: classify(err), Detail: err.Error()}
}

// classify maps a dial/read/write error to HitResult.Err's classes.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host-unreachable"
	case errors.Is(err, syscall.ENETUNREACH):
		return "net-unreachable"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return "denied"
	case errors.Is(err, io.EOF):
		return "eof"
	}
	return "other"
}
