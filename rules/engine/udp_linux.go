package engine

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// udpListener receives datagrams on one port and forwards them, one upstream socket per client address.
// One goroutine reads the listener socket; the upstream sockets of every flow of the engine are watched
// by the engine's udpPoller, so that neither a flow nor a listener costs a goroutine of its own there.
type udpListener struct {
	e    *Engine
	p    *udpPoller
	key  Key
	conn *net.UDPConn
	v6   bool
	bal  balancer
	n    atomic.Int64

	closed atomic.Bool
	// draining is set once the listener stops reading (stopTaking); its flows still get their replies.
	draining atomic.Bool
	done     sync.WaitGroup

	mu    sync.Mutex
	flows map[netip.AddrPort]*udpFlow // by client address
}

// udpFlow is one client address's upstream socket.
type udpFlow struct {
	l      *udpListener
	client netip.AddrPort
	local  netip.Addr // where the client's packets were delivered: the replies' source
	ep     netip.AddrPort
	fd     int
	last   atomic.Int64 // unix nanoseconds of the last packet either way
	// lastReply is when the endpoint last answered (unix nanoseconds): a flow whose last packet came from
	// the client waits for an answer.
	lastReply atomic.Int64

	// io guards reads and writes of fd against its close: once closed, the number may be another flow's
	// socket, which must never see this flow's datagrams.
	io     sync.Mutex
	closed bool
}

// write sends a datagram upstream; false once the flow is closed.
func (f *udpFlow) write(b []byte) error {
	f.io.Lock()
	defer f.io.Unlock()
	if f.closed {
		return net.ErrClosed
	}
	_, err := unix.Write(f.fd, b)
	return err
}

func (e *Engine) listenUDP(key Key, t Target, port uint16) (listener, error) {
	if e.poller == nil {
		p, err := newUDPPoller(e.opts.UDPIdleTimeout)
		if err != nil {
			return nil, err
		}
		e.poller = p
	}
	conn, err := e.listenUDPSocket(key, port)
	if err != nil {
		return nil, err
	}
	l := &udpListener{e: e, p: e.poller, key: key, conn: conn, v6: e.family == v1.IPv6Protocol, flows: map[netip.AddrPort]*udpFlow{}}
	if err := l.setup(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	l.bal.set(t)
	l.p.register(l)
	l.done.Add(1)
	go l.readClients()
	return l, nil
}

// setup asks for the packets' destination addresses.
func (l *udpListener) setup() error {
	rc, err := l.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if l.v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		}
	}); err != nil {
		return err
	}
	return serr
}

func (l *udpListener) port() uint16 { return uint16(l.conn.LocalAddr().(*net.UDPAddr).Port) }

// setTarget replaces the endpoints. Flows to removed endpoints end at once: a UDP client keeps sending to
// the Service address and gets a new flow to a current endpoint with its next packet.
func (l *udpListener) setTarget(t Target) {
	l.bal.set(t)
	l.mu.Lock()
	var gone []*udpFlow
	for _, f := range l.flows {
		if !l.bal.has(f.ep) {
			gone = append(gone, f)
		}
	}
	for _, f := range gone {
		l.dropLocked(f)
	}
	l.mu.Unlock()
}

// stopTaking stops reading datagrams, which then wait in the socket's queue, and waits for the reader to
// end. The socket stays open: the flows' replies leave through it.
func (l *udpListener) stopTaking() {
	if l.closed.Load() || l.draining.Swap(true) {
		return
	}
	_ = l.conn.SetReadDeadline(time.Now())
	l.done.Wait()
}

// inFlight counts the flows that wait for an answer to their client's last datagram (until it comes or
// the flow idles out) and those being opened.
func (l *udpListener) inFlight() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := max(l.n.Load()-int64(len(l.flows)), 0)
	for _, f := range l.flows {
		if f.last.Load() > f.lastReply.Load() {
			n++
		}
	}
	return n
}

func (l *udpListener) close() {
	if l.closed.Swap(true) {
		return
	}
	_ = l.conn.Close()
	l.done.Wait()
	l.p.unregister(l)
	l.mu.Lock()
	for _, f := range l.flows {
		l.dropLocked(f)
	}
	l.mu.Unlock()
}

// dropLocked ends a flow; l.mu is held.
func (l *udpListener) dropLocked(f *udpFlow) {
	if l.flows[f.client] != f {
		return
	}
	delete(l.flows, f.client)
	l.p.remove(f)
	f.io.Lock()
	f.closed = true
	_ = unix.Close(f.fd)
	f.io.Unlock()
	l.e.release(v1.ProtocolUDP, &l.n)
}

// readClients forwards each client datagram on its flow, making the flow on a client's first packet.
func (l *udpListener) readClients() {
	defer l.done.Done()
	buf := make([]byte, 65535)
	oob := make([]byte, 128)
	for {
		n, oobn, _, from, err := l.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.closed.Load() || l.draining.Load() {
				return
			}
			klog.V(2).InfoS("Userspace proxy UDP read failed", "service", l.key.Name, "err", err)
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		f := l.safeFlow(from, oob[:oobn])
		if f == nil {
			continue
		}
		f.last.Store(time.Now().UnixNano())
		if err := f.write(buf[:n]); err != nil {
			if errors.Is(err, unix.ECONNREFUSED) {
				// An earlier datagram drew an ICMP port unreachable: this one is lost too, and the next
				// packet of the client starts over with another endpoint.
				l.mu.Lock()
				l.bal.forget(from.Addr(), f.ep)
				l.dropLocked(f)
				l.mu.Unlock()
				l.e.metrics.failedOver.WithLabelValues("UDP").Inc()
			}
			continue
		}
		l.e.metrics.bytes.WithLabelValues("UDP", toEndpoint).Add(float64(n))
	}
}

// safeFlow is flow, with a panic logged and the datagram dropped: a bug must cost one datagram, not the
// listener (or the daemon).
func (l *udpListener) safeFlow(client netip.AddrPort, oob []byte) (f *udpFlow) {
	defer func() {
		if r := recover(); r != nil {
			klog.ErrorS(fmt.Errorf("panic: %v", r), "Userspace proxy UDP flow failed", "service", l.key.Name, "stack", string(debug.Stack()))
			f = nil
		}
	}()
	return l.flow(client, oob)
}

// flow returns the client's flow, making one (nil when no endpoint can be reached or a limit is reached).
func (l *udpListener) flow(client netip.AddrPort, oob []byte) *udpFlow {
	l.mu.Lock()
	f := l.flows[client]
	l.mu.Unlock()
	if f != nil {
		return f
	}
	local, ok := pktinfoDst(oob)
	if !ok {
		klog.V(2).InfoS("Userspace proxy UDP datagram without its destination address; dropped", "service", l.key.Name)
		return nil
	}
	now := time.Now()
	order := l.bal.order(client.Addr(), now)
	if len(order) == 0 {
		return nil
	}
	if !l.e.admit(l.key, &l.n) {
		return nil
	}
	// A second round only when a sync replaced the endpoints while the first one dialed.
	for range 2 {
		f, stale := l.openFlow(client, local, order, now)
		if f != nil {
			return f
		}
		if !stale {
			break
		}
		if order = l.bal.order(client.Addr(), now); len(order) == 0 {
			break
		}
	}
	l.e.release(v1.ProtocolUDP, &l.n)
	l.e.metrics.failed.WithLabelValues("UDP").Inc()
	return nil
}

// openFlow dials the endpoints of order until a socket is open, and makes it client's flow. stale reports
// that it stopped because order's endpoint is no longer one of the listener's: a sync replaced the
// endpoints after order was taken, and its sweep of the flows (setTarget) has passed, so a flow to that
// endpoint would outlive its removal for as long as the client keeps sending.
func (l *udpListener) openFlow(client netip.AddrPort, local netip.Addr, order []netip.AddrPort, now time.Time) (f *udpFlow, stale bool) {
	for i, ep := range order {
		fd, err := dialUDP(ep)
		if err != nil {
			if i < len(order)-1 {
				l.e.metrics.failedOver.WithLabelValues("UDP").Inc()
			}
			continue
		}
		f = &udpFlow{l: l, client: client, local: local, ep: ep, fd: fd}
		f.last.Store(now.UnixNano())
		l.mu.Lock()
		if l.closed.Load() || !l.bal.has(ep) {
			l.mu.Unlock()
			_ = unix.Close(fd)
			return nil, !l.closed.Load()
		}
		if err := l.p.add(f); err != nil {
			l.mu.Unlock()
			_ = unix.Close(fd)
			continue
		}
		l.flows[client] = f
		l.mu.Unlock()
		l.bal.used(client.Addr(), ep, now)
		return f, false
	}
	return nil, false
}

// dialUDP returns a non-blocking UDP socket connected to ep.
func dialUDP(ep netip.AddrPort) (int, error) {
	var (
		domain int
		sa     unix.Sockaddr
	)
	if a := ep.Addr().Unmap(); a.Is4() {
		domain, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ep.Port()), Addr: a.As4()}
	} else {
		domain, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ep.Port()), Addr: a.As16()}
	}
	fd, err := unix.Socket(domain, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, sa); err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// udpPoller waits on the upstream sockets of every UDP flow of an engine, in one epoll set served by one
// goroutine, sends replies back through their listeners, and expires idle flows.
type udpPoller struct {
	epfd, wakefd int
	timeout      time.Duration

	mu        sync.Mutex
	byFD      map[int32]*udpFlow
	listeners map[*udpListener]struct{}
	closed    bool
	done      chan struct{}
}

func newUDPPoller(timeout time.Duration) (*udpPoller, error) {
	p := &udpPoller{timeout: timeout, byFD: map[int32]*udpFlow{}, listeners: map[*udpListener]struct{}{}, done: make(chan struct{})}
	var err error
	if p.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("creating the UDP epoll set: %w", err)
	}
	if p.wakefd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err == nil {
		err = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, p.wakefd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(p.wakefd)})
	}
	if err != nil {
		_ = unix.Close(p.epfd)
		if p.wakefd > 0 {
			_ = unix.Close(p.wakefd)
		}
		return nil, fmt.Errorf("creating the UDP poller's eventfd: %w", err)
	}
	go p.run()
	return p, nil
}

func (p *udpPoller) register(l *udpListener) {
	p.mu.Lock()
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
}

func (p *udpPoller) unregister(l *udpListener) {
	p.mu.Lock()
	delete(p.listeners, l)
	p.mu.Unlock()
}

// add watches a flow's socket.
func (p *udpPoller) add(f *udpFlow) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, f.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(f.fd)}); err != nil {
		return err
	}
	p.byFD[int32(f.fd)] = f
	return nil
}

// remove stops watching a flow's socket (before it is closed).
func (p *udpPoller) remove(f *udpFlow) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byFD[int32(f.fd)] == f {
		delete(p.byFD, int32(f.fd))
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, f.fd, nil)
	}
}

// close stops the loop; the listeners are closed first.
func (p *udpPoller) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(p.wakefd, one[:])
	<-p.done
	_ = unix.Close(p.epfd)
	_ = unix.Close(p.wakefd)
}

func (p *udpPoller) run() {
	defer close(p.done)
	tick := max(p.timeout/4, time.Millisecond)
	events := make([]unix.EpollEvent, 128)
	buf := make([]byte, 65535)
	lastSweep := time.Now()
	for {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		n, err := unix.EpollWait(p.epfd, events, int(tick/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			klog.ErrorS(err, "Userspace proxy UDP epoll failed")
			time.Sleep(tick)
			continue
		}
		for i := range n {
			fd := events[i].Fd
			if int(fd) == p.wakefd {
				continue
			}
			p.mu.Lock()
			f := p.byFD[fd]
			p.mu.Unlock()
			if f != nil {
				f.l.drain(f, buf)
			}
		}
		if now := time.Now(); now.Sub(lastSweep) >= tick {
			lastSweep = now
			p.mu.Lock()
			ls := make([]*udpListener, 0, len(p.listeners))
			for l := range p.listeners {
				ls = append(ls, l)
			}
			p.mu.Unlock()
			for _, l := range ls {
				l.expire(now, p.timeout)
			}
		}
	}
}

// drain reads every datagram waiting on f's socket and sends it to the client.
func (l *udpListener) drain(f *udpFlow, buf []byte) {
	oob := pktinfoSrc(f.local)
	f.io.Lock()
	defer f.io.Unlock()
	if f.closed {
		return
	}
	for {
		n, err := unix.Read(f.fd, buf)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBADF) {
				return
			}
			if errors.Is(err, unix.ECONNREFUSED) {
				continue // an ICMP error for an earlier datagram; the socket stays usable
			}
			return
		}
		now := time.Now().UnixNano()
		f.last.Store(now)
		f.lastReply.Store(now)
		if _, _, err := l.conn.WriteMsgUDPAddrPort(buf[:n], oob, f.client); err != nil {
			klog.V(4).InfoS("Userspace proxy UDP reply failed", "service", l.key.Name, "client", f.client, "err", err)
			continue
		}
		l.e.metrics.bytes.WithLabelValues("UDP", toClient).Add(float64(n))
	}
}

// expire ends flows without a packet for timeout.
func (l *udpListener) expire(now time.Time, timeout time.Duration) {
	cut := now.Add(-timeout).UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.flows {
		if f.last.Load() <= cut {
			l.dropLocked(f)
		}
	}
}

// pktinfoDst returns the destination address of a received datagram from its control messages.
func pktinfoDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			var a [4]byte
			copy(a[:], m.Data[8:12]) // ipi_addr: the header's destination address
			return netip.AddrFrom4(a), true
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			var a [16]byte
			copy(a[:], m.Data[:16])
			return netip.AddrFrom16(a), true
		}
	}
	return netip.Addr{}, false
}

// pktinfoSrc returns the control message that makes a datagram leave from src.
func pktinfoSrc(src netip.Addr) []byte {
	if src.Is4() {
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
	}
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: src.As16()})
}
