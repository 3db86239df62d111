package harness

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
)

// BridgeAddr is where Bridge listens inside a namespace.
const BridgeAddr = "127.0.0.1:6443"

// Bridge makes the host's apiserver reachable from inside ns at 127.0.0.1:6443 (a fresh namespace has
// a loopback of its own): a listener created inside ns proxies each connection to the apiserver's
// loopback port, in-process. It returns the path of a kube-proxy-user kubeconfig for
// https://127.0.0.1:6443 and a stop function (idempotent) that closes the listener and every proxied
// connection. Connections made while the apiserver is stopped are reset at once, so clients see
// the outage and retry.
func (c *Cluster) Bridge(ns *NetNS) (kubeconfig string, stop func(), err error) {
	return c.BridgeAt(ns, BridgeAddr, UserKubeProxy)
}

// BridgeAt is Bridge with the listen address inside ns and the kubeconfig's user chosen. The address
// must be one the apiserver's certificate is valid for: loopback, NodeIP or NodeIPv6.
func (c *Cluster) BridgeAt(ns *NetNS, listenAddr, user string) (kubeconfig string, stop func(), err error) {
	kubeconfig, err = c.Kubeconfig(user, "https://"+listenAddr)
	if err != nil {
		return "", nil, err
	}
	l, err := ns.Listen("tcp", listenAddr)
	if err != nil {
		return "", nil, fmt.Errorf("bridge into %s: %w", ns.Name, err)
	}
	target := strings.TrimPrefix(c.Server, "https://")
	b := &bridge{l: l, target: target, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	return kubeconfig, b.stop, nil
}

type bridge struct {
	l        net.Listener
	target   string
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
	stopOnce sync.Once
}

func (b *bridge) serve() {
	defer b.wg.Done()
	for {
		in, err := b.l.Accept()
		if err != nil {
			return // listener closed by stop
		}
		b.wg.Add(1)
		go b.pipe(in)
	}
}

// track registers c so stop can close it; it reports false (and closes c) once stopping.
func (b *bridge) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		_ = c.Close()
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *bridge) untrack(c net.Conn) {
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
	_ = c.Close()
}

func (b *bridge) pipe(in net.Conn) {
	defer b.wg.Done()
	if !b.track(in) {
		return
	}
	defer b.untrack(in)
	// This goroutine is not in the namespace: the dial goes to the host's loopback.
	out, err := net.Dial("tcp", b.target)
	if err != nil {
		// Reset rather than close, the nearest thing to the refusal the client would get if it
		// could dial the stopped apiserver directly.
		if tc, ok := in.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		return
	}
	if !b.track(out) {
		return
	}
	defer b.untrack(out)
	// When either side ends, end both: TLS and HTTP/2 do not rely on half-closed connections.
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(out, in)
	go cp(in, out)
	<-done
	_ = in.Close()
	_ = out.Close()
	<-done
}

func (b *bridge) stop() {
	b.stopOnce.Do(func() {
		_ = b.l.Close()
		b.mu.Lock()
		b.closed = true
		for c := range b.conns {
			_ = c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
}
