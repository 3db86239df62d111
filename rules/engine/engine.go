package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Options tune the engine. Zero values take the defaults below.
type Options struct {
	// ConnectTimeout bounds each TCP connect to one endpoint before the next one is tried (default 2 s).
	ConnectTimeout time.Duration
	// IdleTimeout closes a TCP connection idle in both directions this long (default 0: never).
	IdleTimeout time.Duration
	// UDPIdleTimeout closes a UDP flow without packets in either direction this long (default 250 ms).
	UDPIdleTimeout time.Duration
	// MaxConnsPerListener caps concurrent TCP connections and UDP flows of one listener, so that one
	// Service port cannot take every descriptor from the others (default: half of what the budget allows
	// in connections; negative: no cap but the budget).
	MaxConnsPerListener int
	// Budget is the file descriptors the engine may hold, shared with the other engines: a listener takes
	// one, a TCP connection or UDP flow two. Default: the process's budget (ProcessBudget), which every
	// engine of the daemon shares, whichever mode built it.
	Budget *Budget
	// Sockets, when set, hands the listeners' sockets over to the daemon's next process (see Sockets).
	Sockets Sockets
}

// Budget is a number of file descriptors that engines share. Its methods are safe for concurrent use.
type Budget struct {
	max  int64
	used atomic.Int64
}

// NewBudget returns a budget of n descriptors.
func NewBudget(n int) *Budget { return &Budget{max: int64(n)} }

// ProcessBudget is the one budget of the process's engines: what RLIMIT_NOFILE leaves after 1,024
// descriptors kept for everything else (DefaultDescriptors), read when first asked for.
var ProcessBudget = sync.OnceValue(func() *Budget { return NewBudget(DefaultDescriptors()) })

// Max returns the budget's size.
func (b *Budget) Max() int { return int(b.max) }

// Used returns the descriptors taken.
func (b *Budget) Used() int { return int(b.used.Load()) }

func (b *Budget) take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *Budget) give(n int64) { b.used.Add(-n) }

const (
	defaultConnectTimeout = 2 * time.Second
	defaultUDPIdleTimeout = 250 * time.Millisecond
)

func (o Options) withDefaults() Options {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = defaultConnectTimeout
	}
	if o.UDPIdleTimeout <= 0 {
		o.UDPIdleTimeout = defaultUDPIdleTimeout
	}
	if o.Budget == nil {
		o.Budget = ProcessBudget()
	}
	if o.MaxConnsPerListener == 0 {
		o.MaxConnsPerListener = max(o.Budget.Max()/4, 1)
	}
	return o
}

// Key names one listener: a Service port and which of its endpoint selections it forwards to ("cluster"
// or "local"), or anything else a front chooses.
type Key struct {
	Name     string
	Protocol v1.Protocol
	Policy   string
}

func (k Key) String() string { return fmt.Sprintf("%s/%s(%s)", k.Name, k.Protocol, k.Policy) }

// Target is what a listener forwards to.
type Target struct {
	// Endpoints in the order round-robin walks them.
	Endpoints []netip.AddrPort
	// Affinity is the ClientIP session affinity timeout; 0 means none.
	Affinity time.Duration
}

// Engine owns the listeners. Its methods are safe for concurrent use.
type Engine struct {
	opts    Options
	metrics *Metrics
	family  v1.IPFamily
	bind    netip.Addr

	mu        sync.Mutex
	listeners map[Key]listener
	// poller watches every UDP flow's upstream socket (made with the first UDP listener).
	poller *udpPoller
	// lastLimitLog rate-limits the log line for a reached limit, per listener key (and "" for the total).
	lastLimitLog map[string]time.Time
}

// listener is one TCP or UDP listener.
type listener interface {
	port() uint16
	setTarget(Target)
	// stopTaking stops taking new connections (TCP) or datagrams (UDP); what is under way goes on.
	stopTaking()
	// inFlight is the number of connections or flows under way.
	inFlight() int64
	close()
}

// New returns an engine whose listeners bind to bind (the family's unspecified address when invalid) on
// ports the kernel chooses.
func New(family v1.IPFamily, bind netip.Addr, opts Options, m *Metrics) *Engine {
	if !bind.IsValid() {
		bind = netip.IPv4Unspecified()
		if family == v1.IPv6Protocol {
			bind = netip.IPv6Unspecified()
		}
	}
	return &Engine{opts: opts.withDefaults(), metrics: m, family: family, bind: bind,
		listeners: map[Key]listener{}, lastLimitLog: map[string]time.Time{}}
}

// Options returns the options in force, defaults applied.
func (e *Engine) Options() Options { return e.opts }

// Ensure makes the listener of key forward to t, opening it on a port the kernel picks when needed, and
// returns its port.
func (e *Engine) Ensure(key Key, t Target) (uint16, error) { return e.EnsureAt(key, 0, t) }

// EnsureAt is Ensure on a given port (0: any): a listener of key on another port is closed (its
// connections keep running) and one on port opened.
func (e *Engine) EnsureAt(key Key, port uint16, t Target) (uint16, error) {
	e.mu.Lock()
	if l, ok := e.listeners[key]; ok {
		if port == 0 || l.port() == port {
			l.setTarget(t)
			e.mu.Unlock()
			return l.port(), nil
		}
		e.mu.Unlock()
		e.Remove(key)
		e.mu.Lock()
	}
	defer e.mu.Unlock()
	if !e.opts.Budget.take(1) {
		e.metrics.refused.WithLabelValues(string(key.Protocol), limitTotal).Inc()
		return 0, fmt.Errorf("opening listener for %s: the descriptor budget (%d) is used up", key, e.opts.Budget.Max())
	}
	var (
		l   listener
		err error
	)
	switch key.Protocol {
	case v1.ProtocolTCP:
		l, err = e.listenTCP(key, t, port)
	case v1.ProtocolUDP:
		l, err = e.listenUDP(key, t, port)
	default:
		err = fmt.Errorf("protocol %s is not supported by the userspace proxy", key.Protocol)
	}
	if err != nil {
		e.opts.Budget.give(1)
		return 0, fmt.Errorf("opening listener for %s: %w", key, err)
	}
	e.listeners[key] = l
	e.metrics.listeners.WithLabelValues(string(key.Protocol)).Inc()
	klog.V(2).InfoS("Opened userspace proxy listener", "service", key.Name, "protocol", key.Protocol, "policy", key.Policy, "port", l.port())
	return l.port(), nil
}

// Port returns the port of key's listener, or 0.
func (e *Engine) Port(key Key) uint16 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l, ok := e.listeners[key]; ok {
		return l.port()
	}
	return 0
}

// Keys returns the keys of the open listeners.
func (e *Engine) Keys() []Key {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Key, 0, len(e.listeners))
	for k := range e.listeners {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b Key) int {
		if c := compare(a.Name, b.Name); c != 0 {
			return c
		}
		if c := compare(string(a.Protocol), string(b.Protocol)); c != 0 {
			return c
		}
		return compare(a.Policy, b.Policy)
	})
	return out
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Remove closes key's listener and drops its socket from the store (Options.Sockets). Its established TCP
// connections keep running until they end; its UDP flows end at once.
func (e *Engine) Remove(key Key) {
	if e.closeListener(key) {
		e.forgetSocket(key)
	}
}

// closeListener closes key's listener and reports whether there was one.
func (e *Engine) closeListener(key Key) bool {
	e.mu.Lock()
	l, ok := e.listeners[key]
	delete(e.listeners, key)
	delete(e.lastLimitLog, key.String())
	e.mu.Unlock()
	if ok {
		l.close()
		e.opts.Budget.give(1)
		e.metrics.listeners.WithLabelValues(string(key.Protocol)).Dec()
		klog.V(2).InfoS("Closed userspace proxy listener", "service", key.Name, "protocol", key.Protocol, "policy", key.Policy)
	}
	return ok
}

// Close closes every listener. Their sockets stay in the store (Options.Sockets), for the next process.
func (e *Engine) Close() {
	for _, k := range e.Keys() {
		e.closeListener(k)
	}
	e.mu.Lock()
	p := e.poller
	e.poller = nil
	e.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// Drain stops taking new connections and datagrams and waits until the connections and UDP flows under
// way have ended or gone quiet (a kept-alive TCP connection whose endpoint spoke last does not hold it up),
// or ctx is done; it returns how many were still under way then. The engine's copies of
// the listening sockets close (a UDP socket stays open for the replies of its flows): a socket kept in
// the store (Options.Sockets) stays open there, and what arrives from now on waits in its queue for the
// next process; without a store, new connections are refused from now on. Call it when the daemon stops.
func (e *Engine) Drain(ctx context.Context) int64 {
	e.mu.Lock()
	ls := make([]listener, 0, len(e.listeners))
	for _, l := range e.listeners {
		ls = append(ls, l)
	}
	e.mu.Unlock()
	for _, l := range ls {
		l.stopTaking()
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int64
		for _, l := range ls {
			n += l.inFlight()
		}
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
	}
}

// admit takes a slot for a new connection or flow of a listener holding n of them; false (counted and
// logged) when a limit is reached.
func (e *Engine) admit(key Key, n *atomic.Int64) bool {
	proto := string(key.Protocol)
	if max := e.opts.MaxConnsPerListener; max > 0 && n.Add(1) > int64(max) {
		n.Add(-1)
		e.metrics.refused.WithLabelValues(proto, limitService).Inc()
		e.logLimit(key.String(), "Userspace proxy connection limit of a Service port reached; new connections are reset",
			"service", key.Name, "protocol", key.Protocol, "limit", max)
		return false
	} else if max <= 0 {
		n.Add(1)
	}
	if !e.opts.Budget.take(2) {
		n.Add(-1)
		e.metrics.refused.WithLabelValues(proto, limitTotal).Inc()
		e.logLimit("", "Userspace proxy descriptor budget used up; new connections are reset",
			"descriptors", e.opts.Budget.Max(), "maxConnections", e.opts.Budget.Max()/2)
		return false
	}
	e.metrics.accepted.WithLabelValues(proto).Inc()
	e.metrics.active.WithLabelValues(proto).Inc()
	return true
}

// release gives back what admit took.
func (e *Engine) release(proto v1.Protocol, n *atomic.Int64) {
	n.Add(-1)
	e.opts.Budget.give(2)
	e.metrics.active.WithLabelValues(string(proto)).Dec()
}

// logLimit logs a reached limit at most every 10 s per limit.
func (e *Engine) logLimit(which, msg string, kv ...any) {
	e.mu.Lock()
	now := time.Now()
	last, seen := e.lastLimitLog[which]
	log := !seen || now.Sub(last) >= 10*time.Second
	if log {
		e.lastLimitLog[which] = now
	}
	e.mu.Unlock()
	if log {
		klog.InfoS(msg, kv...)
	}
}

// errNoEndpoints is returned when a listener has no endpoint to forward to.
var errNoEndpoints = errors.New("no endpoints")
