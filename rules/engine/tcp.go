package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// tcpListener accepts connections on one port and forwards each to an endpoint.
type tcpListener struct {
	e   *Engine
	key Key
	ln  *net.TCPListener
	bal balancer
	n   atomic.Int64 // concurrent connections

	mu    sync.Mutex
	conns map[*tcpConn]struct{}
	done  chan struct{}
}

// tcpConn is one proxied connection.
type tcpConn struct {
	client, upstream *net.TCPConn
	ep               netip.AddrPort
	draining         bool // guarded by tcpListener.mu
	idle             *time.Timer
}

func (e *Engine) listenTCP(key Key, t Target, port uint16) (*tcpListener, error) {
	ln, err := e.listenTCPSocket(key, port)
	if err != nil {
		return nil, err
	}
	l := &tcpListener{e: e, key: key, ln: ln, conns: map[*tcpConn]struct{}{}, done: make(chan struct{})}
	l.bal.set(t)
	go l.serve()
	return l, nil
}

func (l *tcpListener) port() uint16 { return uint16(l.ln.Addr().(*net.TCPAddr).Port) }

// setTarget replaces the endpoints; connections to endpoints no longer present keep running, counted as
// draining.
func (l *tcpListener) setTarget(t Target) {
	l.bal.set(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if !c.draining && !l.bal.has(c.ep) {
			c.draining = true
			l.e.metrics.draining.WithLabelValues("TCP").Inc()
		}
	}
}

// stopTaking closes this process's copy of the listening socket and waits for the accept loop to end.
func (l *tcpListener) stopTaking() {
	_ = l.ln.Close()
	<-l.done
}

// inFlight counts the connections in the middle of an exchange (see busy) and those still connecting to
// an endpoint.
func (l *tcpListener) inFlight() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := max(l.n.Load()-int64(len(l.conns)), 0)
	for c := range l.conns {
		if c.busy() {
			n++
		}
	}
	return n
}

// drainQuiet is how long a connection must have been quiet, the endpoint having spoken last, to count as
// between exchanges (a kept-alive connection) rather than under way.
const drainQuiet = 100 * time.Millisecond

// busy reports whether c is under way: data came from either side within drainQuiet, or the client spoke
// last (a request waits for its answer; an endpoint that never sent anything has not answered). Without
// TCP_INFO every connection is.
func (c *tcpConn) busy() bool {
	fromClient, clientBytes, okC := heard(c.client)
	fromEndpoint, endpointBytes, okE := heard(c.upstream)
	switch {
	case !okC || !okE:
		return true
	case min(fromClient, fromEndpoint) < drainQuiet:
		return true
	case endpointBytes == 0:
		return clientBytes > 0
	default:
		return fromClient < fromEndpoint
	}
}

// close stops accepting; established connections are left to end on their own, as when an endpoint is
// removed.
func (l *tcpListener) close() {
	_ = l.ln.Close()
	<-l.done
	l.setTarget(Target{})
}

func (l *tcpListener) serve() {
	defer close(l.done)
	var delay time.Duration
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, most likely: back off as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			klog.ErrorS(err, "Userspace proxy accept failed; retrying", "service", l.key.Name, "delay", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if !l.e.admit(l.key, &l.n) {
			reset(c)
			continue
		}
		go l.handle(c)
	}
}

// reset closes c with an RST, as a refused connection would be.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// handle connects c to an endpoint and copies until both directions are done.
func (l *tcpListener) handle(client *net.TCPConn) {
	defer l.e.release(v1.ProtocolTCP, &l.n)
	defer func() {
		// A bug must cost this connection, not every Service of the node.
		if r := recover(); r != nil {
			klog.ErrorS(fmt.Errorf("panic: %v", r), "Userspace proxy connection handler failed", "service", l.key.Name, "stack", string(debug.Stack()))
			reset(client)
		}
	}()
	up, ep, err := l.connect(client)
	if err != nil {
		l.e.metrics.failed.WithLabelValues("TCP").Inc()
		klog.V(2).InfoS("Userspace proxy could not reach any endpoint", "service", l.key.Name, "client", client.RemoteAddr(), "err", err)
		reset(client)
		return
	}
	c := &tcpConn{client: client, upstream: up, ep: ep}
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	if d := l.e.opts.IdleTimeout; d > 0 {
		c.idle = time.AfterFunc(d, func() { l.checkIdle(c, d) })
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.pipe(up, client, toEndpoint)
	}()
	l.pipe(client, up, toClient)
	wg.Wait()
	if c.idle != nil {
		c.idle.Stop()
	}
	_ = client.Close()
	_ = up.Close()

	l.mu.Lock()
	delete(l.conns, c)
	draining := c.draining
	l.mu.Unlock()
	if draining {
		l.e.metrics.draining.WithLabelValues("TCP").Dec()
		l.e.metrics.drained.WithLabelValues("TCP").Inc()
	}
}

// pipe copies src to dst (splice between two TCP sockets, see copyStream) and passes src's EOF on as a
// half-close. On an error both sockets are closed, which ends the other direction too.
func (l *tcpListener) pipe(dst, src *net.TCPConn, dir string) {
	n, err := copyStream(dst, src)
	l.e.metrics.bytes.WithLabelValues("TCP", dir).Add(float64(n))
	if err != nil {
		// A reset or an idle close: the whole connection is over.
		_ = src.Close()
		_ = dst.Close()
		return
	}
	_ = dst.CloseWrite()
	_ = src.CloseRead()
}

// connect dials the endpoints in the balancer's order until one answers within the connect timeout.
func (l *tcpListener) connect(client *net.TCPConn) (*net.TCPConn, netip.AddrPort, error) {
	clientIP := netip.Addr{}
	if a, ok := client.RemoteAddr().(*net.TCPAddr); ok {
		clientIP = a.AddrPort().Addr().Unmap()
	}
	now := time.Now()
	order := l.bal.order(clientIP, now)
	if len(order) == 0 {
		return nil, netip.AddrPort{}, errNoEndpoints
	}
	var errs []error
	d := net.Dialer{Timeout: l.e.opts.ConnectTimeout}
	for i, ep := range order {
		c, err := d.DialContext(context.Background(), "tcp", ep.String())
		if err == nil {
			l.bal.used(clientIP, ep, time.Now())
			return c.(*net.TCPConn), ep, nil
		}
		errs = append(errs, err)
		l.bal.forget(clientIP, ep)
		if i < len(order)-1 {
			l.e.metrics.failedOver.WithLabelValues("TCP").Inc()
			klog.V(4).InfoS("Userspace proxy endpoint failed; trying the next", "service", l.key.Name, "endpoint", ep, "err", err)
		}
	}
	return nil, netip.AddrPort{}, errors.Join(errs...)
}

// checkIdle closes c when neither socket has received data for d; otherwise it looks again when d would
// have passed since the most recent data.
func (l *tcpListener) checkIdle(c *tcpConn, d time.Duration) {
	a, okA := idleFor(c.client)
	b, okB := idleFor(c.upstream)
	if !okA || !okB {
		return // closed, or no TCP_INFO here: no idle timeout
	}
	idle := min(a, b)
	if idle >= d {
		klog.V(4).InfoS("Userspace proxy closing an idle connection", "service", l.key.Name, "endpoint", c.ep, "idle", idle)
		_ = c.client.Close()
		_ = c.upstream.Close()
		return
	}
	c.idle.Reset(d - idle)
}
