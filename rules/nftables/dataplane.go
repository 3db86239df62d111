package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/internal/syncstate"
)

// cleaner removes stale conntrack entries after a sync (conntrack.Cleaner).
type cleaner = syncstate.Cleaner

// staleAfter is how long a flushed per-Service chain waits before it is deleted, and so do the old rules
// left behind inserted ones (plan.supersede) and the affinity sets only those name.
const staleAfter = time.Second

// Dataplane is mode nftables for one IP family: upstream's kube-proxy table, written through kernel.
//
// The first sync, and any sync after a failure, rebuilds the table: it reads what the kernel holds and
// writes everything, in transactions that each leave a working table. Afterwards a sync writes only the
// Service ports that changed, planned against a mirror of what was written, without reading the kernel.
// The periodic sync (full set by the runner) reads the table back and compares it with the mirror: when
// someone changed it (a deleted table, chain or element), it logs that once, counts it, and rebuilds.
// There is no hourly rewrite, as upstream has: rewriting every chain creates every Service's anonymous set
// again, which costs the kernel time quadratic in the number of Services (11 s at 10,000), while the
// check costs 0.2 s. A failed transaction leaves the kernel as it was (each is atomic) and makes the next
// sync a rebuild.
type Dataplane struct {
	family  v1.IPFamily
	kernel  kernel
	cleaner cleaner
	metrics *familyMetrics
	// localhost serves TCP NodePorts on loopback (the KubeProxyNFTablesLocalhostNodePorts gate on);
	// nil with the gate off.
	localhost *localhostProxy
	// localAddrs lists the node's addresses (proxy.InterfaceAddrs).
	localAddrs func() ([]netip.Addr, error)
	chunk      chunk
	now        func() time.Time

	// applyMu is held by Apply and by the watcher's check, so that they take turns.
	applyMu sync.Mutex
	// staleFlushed tells the watcher that a sync left chains, rules or sets to delete staleAfter later.
	staleFlushed chan struct{}

	// mu guards what Reconfigure changes; Apply runs on the sync goroutine. state is taken after it (its
	// lock is a leaf).
	mu       sync.Mutex
	cfg      Config
	renderer *renderer
	// diffAll makes the next partial sync compare every Service port (after a reload).
	diffAll bool
	// state: whether the next sync must rebuild the table (its Full), and the snapshot last applied.
	state syncstate.State

	// Owned by the sync goroutine.
	m *mirror
}

var _ proxy.Dataplane = (*Dataplane)(nil)

// newDataplane returns the dataplane of cfg.Family writing through k.
func newDataplane(cfg Config, k kernel, c cleaner, m *Metrics) *Dataplane {
	return &Dataplane{
		family: cfg.Family, kernel: k, cleaner: c, metrics: m.forFamily(cfg.Family),
		localAddrs: proxy.InterfaceAddrs, chunk: defaultChunk, now: time.Now, staleFlushed: make(chan struct{}, 1),
		cfg: cfg, renderer: newRenderer(cfg),
	}
}

// LocalhostNodePortsGate reports whether c turns on the KubeProxyNFTablesLocalhostNodePorts feature gate:
// NodePorts on loopback addresses are then rejected and counted, or served by the localhost proxy.
func LocalhostNodePortsGate(c *config.KubeProxyConfiguration) bool {
	return c.FeatureEnabled("KubeProxyNFTablesLocalhostNodePorts")
}

// ConfigFrom derives the table's configuration of one family from the (validated) configuration file.
func ConfigFrom(c *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	s, err := proxy.SettingsFor(c, family)
	if err != nil {
		return Config{}, err
	}
	gate := LocalhostNodePortsGate(c)
	return Config{Settings: s, LocalhostReject: gate, LocalhostProxy: gate && hasLoopback(s.NodePortAddresses)}, nil
}

// Stop does nothing: the kernel carries mode nftables' traffic, and the table stays when the daemon stops.
// The localhost NodePort listeners close with the process.
func (d *Dataplane) Stop(context.Context) {}

// Reconfigure takes a reloaded configuration file. A change to what the table depends on makes the next
// sync compare every Service port and write what differs; a change to the localhost NodePort gate
// rewrites the table.
func (d *Dataplane) Reconfigure(c *config.KubeProxyConfiguration) error {
	cfg, err := ConfigFrom(c, d.family)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if reflect.DeepEqual(cfg, d.cfg) {
		return nil
	}
	klog.InfoS("nftables rules configuration changed; the next sync compares every Service", "ipFamily", d.family)
	d.cfg, d.renderer, d.diffAll = cfg, newRenderer(cfg), true
	d.state.ReconfiguredPartial()
	return nil
}

// inputs reads the facts besides the Service ports that the table depends on. An error (the node's
// addresses could not be read) fails the sync before it writes: an empty nodeport-ips set would stop
// every NodePort.
func (d *Dataplane) inputs(snap *proxy.Snapshot, cfg *Config) (inputs, error) {
	in := inputs{
		local:        cfg.LocalDetector.For(d.family, &snap.Node),
		nodeIP:       cfg.NodeIP(&snap.Node),
		serviceCIDRs: snap.ServiceCIDRs,
	}
	var err error
	in.nodePortIPs, in.nodePortAll, err = cfg.NodePortIPs(&snap.Node, d.localAddrs)
	if err != nil {
		return in, fmt.Errorf("%s NodePort addresses: %w", d.family, err)
	}
	return in, nil
}

// Apply makes the kernel's table match snap.
func (d *Dataplane) Apply(ctx context.Context, snap *proxy.Snapshot, full bool) error {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	cfg, r, diffAll := d.cfg, d.renderer, d.diffAll
	s := d.state.Begin()
	d.mu.Unlock()
	rebuild := s.Full || d.m == nil
	now := d.now()
	in, err := d.inputs(snap, &cfg)
	if err != nil {
		return err
	}

	if !rebuild {
		if err := d.deleteStale(ctx, now); err != nil {
			d.metrics.cleanupFailures.Inc()
			klog.ErrorS(err, "Could not delete stale chains; the next sync rewrites the table", "ipFamily", d.family)
			return err
		}
	}
	var ks *kernelState
	if full && !rebuild {
		var err error
		if ks, err = d.kernel.Read(ctx); err != nil {
			return fmt.Errorf("reading the %s table back: %w", d.family, err)
		}
		if why := d.m.diff(ks); why != "" {
			syncstate.ChangedExternally(d.metrics.removedExternally, d.family, "nftables table", why)
			rebuild = true
		}
	}

	var (
		p       *plan
		next    *mirror
		changed []proxy.ServicePortName
	)
	if rebuild {
		if ks == nil {
			var err error
			if ks, err = d.kernel.Read(ctx); err != nil {
				return fmt.Errorf("reading the %s table: %w", d.family, err)
			}
		}
		p, next = planRebuild(r, snap, &in, ks, d.chunk)
	} else {
		changed = snap.Changes(s.Last)
		p = planPartial(d.m, r, snap, changed, &in, diffAll)
		next = d.m
	}
	start := time.Now()
	for i, t := range p.txs {
		if klog.V(9).Enabled() {
			klog.V(9).InfoS("nftables transaction", "ipFamily", d.family, "transaction", t.String())
		}
		if err := d.kernel.Run(ctx, t); err != nil {
			d.metrics.syncFailures.Inc()
			return fmt.Errorf("writing the %s table (transaction %d of %d, %d commands): %w", d.family, i+1, len(p.txs), len(t.ops), err)
		}
	}
	next.commit(p, now)
	if p.leavesLeftovers() {
		select {
		case d.staleFlushed <- struct{}{}:
		default:
		}
	}
	klog.V(4).InfoS("nftables sync done", "ipFamily", d.family, "rebuild", rebuild, "transactions", len(p.txs),
		"chainsWritten", p.rewritten, "elapsed", time.Since(start))

	d.m = next
	if d.localhost != nil {
		// After the table: the TCP reject elements are gone before the listeners open, and back before
		// they close.
		d.localhost.sync(snap, cfg.LocalhostProxy)
	}
	d.mu.Lock()
	if d.state.Succeeded(s, snap) { // not reconfigured meanwhile: every port now matches this renderer
		d.diffAll = false
	}
	d.mu.Unlock()
	// Like modes iptables and ipvs, every full sync reconciles the conntrack table too.
	syncstate.CleanConntrack(d.cleaner, d.family, snap, full || rebuild, changed)
	return nil
}

// deleteStale deletes, in one transaction, what syncs left behind at least staleAfter ago: the old rules
// behind inserted ones (by handle, read from the kernel), then the flushed per-Service chains, then the
// affinity sets nothing wants. When chains or sets are due, every pending trim goes first, however recent
// (its insertion was an earlier transaction): its old rules may jump to those chains or name those sets.
func (d *Dataplane) deleteStale(ctx context.Context, now time.Time) error {
	due := func(at time.Time) bool { return now.Sub(at) >= staleAfter }
	var chains, sets, trims []string
	for c, at := range d.m.stale {
		if due(at) {
			chains = append(chains, c)
		}
	}
	for s, at := range d.m.staleSets {
		if due(at) {
			sets = append(sets, s)
		}
	}
	for c, tr := range d.m.trims {
		if due(tr.at) || len(chains) > 0 || len(sets) > 0 {
			trims = append(trims, c)
		}
	}
	if len(chains)+len(sets)+len(trims) == 0 {
		return nil
	}
	slices.Sort(chains)
	slices.Sort(sets)
	slices.Sort(trims)
	t := newTx(d.renderer.fam)
	rules := 0
	if len(trims) > 0 {
		handles, err := d.kernel.RuleHandles(ctx, trims)
		if err != nil {
			return fmt.Errorf("reading the rules to delete: %w", err)
		}
		for _, c := range trims {
			hs := handles[c]
			for _, h := range hs[min(d.m.trims[c].keep, len(hs)):] {
				t.add(op{kind: opDelete, target: c, handle: h})
				rules++
			}
		}
	}
	for _, c := range chains {
		t.add(op{kind: opDelete, chain: &chainSpec{name: c}})
	}
	for _, s := range sets {
		t.add(op{kind: opDelete, set: &setSpec{name: s, key: layoutAddr}})
	}
	if !t.empty() {
		if err := d.kernel.Run(ctx, t); err != nil {
			return fmt.Errorf("deleting %d old rules, %d stale chains and %d stale sets: %w", rules, len(chains), len(sets), err)
		}
	}
	for _, c := range trims {
		delete(d.m.trims, c)
	}
	for _, c := range chains {
		delete(d.m.stale, c)
	}
	for _, s := range sets {
		delete(d.m.staleSets, s)
	}
	klog.V(2).InfoS("Deleted what syncs left behind", "ipFamily", d.family, "rules", rules, "chains", len(chains), "sets", len(sets))
	return nil
}

// Metrics are the nftables dataplane's metrics, under upstream's names where upstream has them.
type Metrics struct {
	syncFailures      *prometheus.CounterVec
	cleanupFailures   *prometheus.CounterVec
	removedExternally *prometheus.CounterVec

	// With the KubeProxyNFTablesLocalhostNodePorts gate on: the localhost NodePort proxies' metrics (the
	// engine's and upstream's listener metrics; the families' engines share the process's descriptor
	// budget, engine.ProcessBudget) and the collector of the rejected loopback NodePort packets.
	engine             *engine.Metrics
	localhostListeners *prometheus.GaugeVec
	localhostFailures  *prometheus.CounterVec
	localhost          localhostCollector
}

// localhostCollector reads the loopback NodePort reject counters of each family's table at a scrape.
type localhostCollector interface {
	prometheus.Collector
	add(family v1.IPFamily, k kernel)
}

// NewMetrics registers the nftables metrics on reg (nil: none). With localhost (the
// KubeProxyNFTablesLocalhostNodePorts gate) it registers the localhost NodePort metrics too, upstream's
// three and the userspace proxy engine's, as upstream registers its own in mode nftables when the gate is on.
func NewMetrics(reg prometheus.Registerer, localhost bool) *Metrics {
	const sub = "kubeproxy"
	m := &Metrics{
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "sync_proxy_rules_nftables_sync_failures_total", Help: "[ALPHA] Cumulative proxy nftables sync failures"}, []string{"ip_family"}),
		cleanupFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "sync_proxy_rules_nftables_cleanup_failures_total", Help: "[ALPHA] Cumulative proxy nftables cleanup failures"}, []string{"ip_family"}),
		removedExternally: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "nftables_changed_externally_total", Help: "Times the kube-proxy table was found changed by someone else (a rewrite restored it)"}, []string{"ip_family"}),
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	reg.MustRegister(m.syncFailures, m.cleanupFailures, m.removedExternally)
	if localhost {
		m.engine = engine.NewMetrics(reg)
		m.localhostListeners = prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub,
			Name: "nftables_localhost_nodeport_listeners",
			Help: "[ALPHA] Number of active localhost NodePort userspace proxy listeners."}, []string{"ip_family"})
		m.localhostFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "nftables_localhost_nodeport_listener_creation_failures_total",
			Help: "[ALPHA] Number of localhost NodePort userspace proxy listener creation failures."}, []string{"ip_family"})
		m.localhost = newLocalhostCollector()
		reg.MustRegister(m.localhostListeners, m.localhostFailures, m.localhost)
	}
	return m
}

type familyMetrics struct {
	syncFailures, cleanupFailures, removedExternally prometheus.Counter
}

// localhostMetrics are what one family's localhost NodePort proxy reports to. As upstream's, the listener
// metrics have a sample for the family once the proxy reported one (not from the start).
type localhostMetrics struct {
	engine    *engine.Metrics
	family    string
	listeners *prometheus.GaugeVec   // kubeproxy_nftables_localhost_nodeport_listeners
	failures  *prometheus.CounterVec // kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total
}

// localhostFor returns a family's localhost NodePort proxy metrics (NewMetrics with localhost).
func (m *Metrics) localhostFor(f v1.IPFamily) localhostMetrics {
	return localhostMetrics{engine: m.engine, family: string(f),
		listeners: m.localhostListeners, failures: m.localhostFailures}
}

func (m *Metrics) forFamily(f v1.IPFamily) *familyMetrics {
	l := prometheus.Labels{"ip_family": string(f)}
	return &familyMetrics{
		syncFailures:      m.syncFailures.With(l),
		cleanupFailures:   m.cleanupFailures.With(l),
		removedExternally: m.removedExternally.With(l),
	}
}
