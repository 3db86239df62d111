package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// Construction and kernel setup: the dataplane's options and metrics, the sysctls and IPVS timeouts it
// sets at start and on reload, and the scheduler probe.

// Defaults of the graceful termination of real servers.
const (
	// DefaultDrainTimeout bounds how long a removed TCP real server stays (with weight 0) while it still has
	// connections: IPVS's own idle timeout for established TCP connections is 900 s, so by then every
	// connection is either gone or has been busy all along.
	DefaultDrainTimeout = 15 * time.Minute
	// DefaultDrainInterval is how often draining real servers are checked for remaining connections.
	DefaultDrainInterval = 5 * time.Second
)

// Option tunes a Dataplane.
type Option func(*options)

type options struct {
	drainTimeout  time.Duration
	drainInterval time.Duration
	now           func() time.Time
}

// WithDrainTimeout sets how long a removed TCP real server may keep its connections (default
// DefaultDrainTimeout); 0 deletes removed real servers at once.
func WithDrainTimeout(d time.Duration) Option { return func(o *options) { o.drainTimeout = d } }

// WithDrainInterval sets how often draining real servers are checked (default DefaultDrainInterval).
func WithDrainInterval(d time.Duration) Option { return func(o *options) { o.drainInterval = d } }

// Metrics are IPVS mode's own metrics; one set, made by NewMetrics, serves both families.
type Metrics struct {
	restoreFailures *prometheus.CounterVec
}

// NewMetrics registers IPVS mode's metrics on reg: the iptables-restore failures of the rules around
// IPVS, under upstream's name.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{restoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "kubeproxy",
		Name: "sync_proxy_rules_iptables_restore_failures_total", Help: "[ALPHA] Cumulative proxy iptables restore failures"},
		[]string{"ip_family"})}
	reg.MustRegister(m.restoreFailures)
	return m
}

// newDataplane wires a Dataplane to its kernel handles (New does so with the real ones), sets the sysctls
// and IPVS timeouts, and starts the drain goroutine unless the drain interval is 0. cl and m may be nil.
func newDataplane(ctx context.Context, cfg Config, k kernel, cl cleaner, m *Metrics, opt ...Option) (*Dataplane, error) {
	o := options{drainTimeout: DefaultDrainTimeout, drainInterval: DefaultDrainInterval, now: time.Now}
	for _, f := range opt {
		f(&o)
	}
	d := &Dataplane{family: cfg.Family, clean: cl, opts: o, cfg: cfg, want: newDesired(), have: newModel(),
		draining: map[vsKey]map[realKey]time.Time{}}
	d.k = counted(k, &d.writes)
	if m != nil {
		d.restoreFailures = m.restoreFailures.WithLabelValues(string(cfg.Family))
	}
	if err := d.setSysctls(); err != nil {
		return nil, err
	}
	if err := d.setTimeouts(); err != nil {
		return nil, err
	}
	if o.drainInterval > 0 {
		go d.drainLoop(ctx)
	}
	return d, nil
}

// probeAddr is where Usable creates a throw-away virtual server to load the scheduler's module, as
// upstream does: TEST-NET-2 (RFC 5737), which no real network uses.
var probeAddr = netip.MustParseAddr("198.51.100.0")

// probeScheduler creates and deletes a virtual server with the scheduler, unless one already uses it.
func probeScheduler(h ipvsHandle, scheduler string) error {
	list, err := h.services()
	if err != nil {
		return err
	}
	for _, s := range list {
		if s.scheduler == scheduler {
			return nil
		}
	}
	k := newVSKey(probeAddr, 20000, protoTCP)
	_ = h.removeService(k)
	if err := h.createService(kernelVS{key: k, scheduler: scheduler}); err != nil {
		return err
	}
	return h.removeService(k)
}

// setSysctls writes the sysctls IPVS mode needs, each only when it differs.
func (d *Dataplane) setSysctls() error {
	type param struct {
		name  string
		value int
	}
	want := []param{
		// Keep conntrack entries for IPVS connections, so iptables' masquerading works on them.
		{"net/ipv4/vs/conntrack", 1},
		// Expire a connection whose real server was deleted on its next packet, instead of dropping
		// packets until it times out.
		{"net/ipv4/vs/expire_nodest_conn", 1},
		// Expire persistence templates of real servers with weight 0 (draining).
		{"net/ipv4/vs/expire_quiescent_template", 1},
		{"net/ipv4/ip_forward", 1},
	}
	// conn_reuse_mode=0 avoided a 1 s delay on reused ports before kernel 5.9 fixed it; upstream sets it on
	// kernels from 4.1 to 5.8 and leaves it alone otherwise.
	if v := d.k.kernelVersion; (v[0] > 4 || v[0] == 4 && v[1] >= 1) && (v[0] < 5 || v[0] == 5 && v[1] < 9) {
		want = append(want, param{"net/ipv4/vs/conn_reuse_mode", 0})
	}
	if d.cfg.StrictARP {
		want = append(want, param{"net/ipv4/conf/all/arp_ignore", 1}, param{"net/ipv4/conf/all/arp_announce", 2})
	}
	for _, s := range want {
		wrote, err := d.k.sysctl.Set(s.name, s.value)
		if err != nil {
			return err
		}
		if wrote {
			klog.V(1).InfoS("Set sysctl", "name", s.name, "value", s.value)
		}
	}
	return nil
}

// setTimeouts sets IPVS's connection timeouts when any is configured (ipvsadm --set).
func (d *Dataplane) setTimeouts() error {
	c := &d.cfg
	if c.TCPTimeout <= 0 && c.TCPFinTimeout <= 0 && c.UDPTimeout <= 0 {
		return nil
	}
	sec := func(t time.Duration) uint32 { return uint32(t / time.Second) }
	if err := d.k.ipvs.setTimeouts(sec(c.TCPTimeout), sec(c.TCPFinTimeout), sec(c.UDPTimeout)); err != nil {
		return fmt.Errorf("setting IPVS timeouts: %w", err)
	}
	return nil
}
