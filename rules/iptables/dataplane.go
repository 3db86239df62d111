package iptables

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/internal/syncstate"
	"kube-proxy/rules/nfacct"
	"kube-proxy/rules/sysctl"
)

// kernel is what the dataplane needs from the iptables tools; xtables.Runner implements it, and tests use
// a fake built on iptrace.Tables.
type kernel interface {
	Restore(ctx context.Context, payload []byte) error
	ListChains(ctx context.Context, table string) ([]string, error)
	EnsureChain(table, chain string) error
	EnsureRule(prepend bool, table, chain string, rule ...string) (bool, error)
	ChainExists(table, chain string) (bool, error)
	RuleExists(table, chain string, rule ...string) (bool, error)
}

// cleaner removes stale conntrack entries after a sync (conntrack.Cleaner).
type cleaner = syncstate.Cleaner

// accounting creates the nfacct counters the rules name (an *nfacct.Client).
type accounting interface {
	Ensure(name string) error
}

// Dataplane is mode iptables for one IP family: it renders each snapshot and writes it with one
// iptables-restore --noflush, rewriting only what changed unless a full sync is due. A failed write leaves
// the kernel as it was (iptables-restore commits each table atomically) and makes the next sync full.
type Dataplane struct {
	family  v1.IPFamily
	kernel  kernel
	cleaner cleaner
	acct    accounting // nil: the kernel has no nfacct
	metrics *familyMetrics

	// checkMu makes the watcher's check for removed rules and the one at the start of a full sync take turns,
	// so that one removal is counted once, whichever of them finds it.
	checkMu sync.Mutex
	// mu guards what Reconfigure changes and the canary watcher reads; Apply runs on the sync goroutine.
	// state is taken after it (its lock is a leaf).
	mu       sync.Mutex
	cfg      Config
	renderer *Renderer
	// state: whether the next sync must be full, and the snapshot last applied successfully.
	state syncstate.State

	lastFull time.Time // when the last full sync started
	// chunkLines is Config.ChunkLines as the writer chose it for its backend; reloads keep it.
	chunkLines int
	// routeLocalnet is set once route_localnet has been turned on for localhost NodePorts (never off
	// again, as upstream: something else on the node may rely on it by then).
	routeLocalnet bool
}

// fullSyncEvery is how often a large ruleset is rewritten in full (upstream's FullSyncPeriod); smaller ones
// are rewritten at every periodic sync.
const fullSyncEvery = time.Hour

var _ proxy.Dataplane = (*Dataplane)(nil)

// NewDataplane returns the dataplane of cfg.Family writing through k (an *xtables.Runner in production).
// With a (an *nfacct.Client; nil when the kernel has no nfacct) it creates upstream's nfacct counters on
// full syncs and its rules count packets in those it could create, whatever cfg.NFAcct says.
func NewDataplane(cfg Config, k kernel, c cleaner, a accounting, m *Metrics) *Dataplane {
	cfg.NFAcct = NFAcct{}
	return &Dataplane{family: cfg.Family, kernel: k, cleaner: c, acct: a, metrics: m.forFamily(cfg.Family),
		cfg: cfg, renderer: NewRenderer(cfg), chunkLines: cfg.ChunkLines}
}

// Config returns the renderer configuration in force.
func (d *Dataplane) Config() Config {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cfg
}

// Reconfigure takes a reloaded configuration file; a change to anything the rules depend on swaps the
// renderer and makes the next sync full.
func (d *Dataplane) Reconfigure(c *config.KubeProxyConfiguration) error {
	cfg, err := ConfigFrom(c, d.family)
	if err != nil {
		return err
	}
	cfg.ChunkLines = d.chunkLines
	d.mu.Lock()
	defer d.mu.Unlock()
	cfg.NFAcct = d.cfg.NFAcct // what the kernel has, not the file
	if reflect.DeepEqual(cfg, d.cfg) {
		return nil
	}
	klog.InfoS("iptables rules configuration changed; next sync rewrites everything", "ipFamily", d.family)
	d.cfg, d.renderer = cfg, NewRenderer(cfg)
	d.state.Reconfigured()
	return nil
}

// sysctlRouteLocalnet lets the kernel route packets addressed to 127.0.0.0/8 that arrive from elsewhere,
// or leave for elsewhere: what DNAT from a localhost NodePort to a pod needs.
const sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"

// enableRouteLocalnet sets route_localnet, only when NodePorts are about to be served on 127.0.0.1 for the
// node's resolved addresses (not for "primary", nor for CIDRs without loopback): opening 127.0.0.0/8 to
// the network is a security matter (CVE-2020-8558), and the rules that drop martian loopback packets
// come with it. A failure is logged, not fatal: every other NodePort still works.
func (d *Dataplane) enableRouteLocalnet() {
	if err := sysctl.Set(sysctlRouteLocalnet, 1); err != nil {
		klog.ErrorS(err, "NodePorts on localhost will not work")
		return
	}
	klog.InfoS("Set route_localnet=1 to serve NodePorts on localhost; to change this, disable "+
		"iptables.localhostNodePorts or leave loopback out of nodePortAddresses", "ipFamily", d.family)
	d.routeLocalnet = true
}

// Apply makes the kernel match snap: a partial write of the Services that changed since the last applied
// snapshot, or everything when full is asked, after a failure, or when the rules were found removed.
func (d *Dataplane) Apply(ctx context.Context, snap *proxy.Snapshot, full bool) error {
	d.checkMu.Lock()
	d.mu.Lock()
	// After a successful sync, a full one (the periodic one, say) may get to rules removed behind our back
	// before the watcher does: it must notice and count them just the same.
	renderer, cfg := d.renderer, d.cfg
	s := d.state.Begin()
	d.mu.Unlock()
	synced, last := !s.Full, s.Last
	check := full && synced
	if check && renderer.Large() && time.Since(d.lastFull) < fullSyncEvery {
		// At scale a full rewrite costs the kernel tens of seconds. Like upstream, the periodic sync then
		// checks that our rules are still there and writes what changed; a real full sync runs hourly, or
		// at once when something was removed.
		full = false
	}
	noted := check && d.noteRemoved(cfg)
	full = full || noted || !synced
	d.checkMu.Unlock()

	var existing map[string][]string
	prev := last
	if full {
		readded, err := d.ensureBase(cfg)
		if err != nil {
			return err
		}
		if check && !noted && readded != "" {
			// Removed between the check above and now: it is repaired just the same, and counted.
			d.countRemoved(readded)
		}
		if nf := d.ensureCounters(); nf != cfg.NFAcct {
			// The counters came or went (the first sync, or one could not be created): a renderer for the
			// new set writes this full sync.
			cfg.NFAcct = nf
			next := NewRenderer(cfg)
			d.mu.Lock()
			if d.state.Current(s) { // not reconfigured meanwhile (else the next sync is full again)
				d.cfg, d.renderer = cfg, next
			}
			d.mu.Unlock()
			renderer = next
		}
		if existing, err = d.existingChains(ctx); err != nil {
			return err
		}
		prev = nil
	}
	if !d.routeLocalnet && cfg.LocalhostNodePortsActive(&snap.Node) {
		d.enableRouteLocalnet()
	}
	changed := snap.Changes(last)
	res, err := renderer.Render(snap, prev, full, existing)
	if err != nil {
		return fmt.Errorf("rendering %s rules: %w", d.family, err)
	}
	if klog.V(9).Enabled() {
		klog.V(9).InfoS("iptables-restore payload", "ipFamily", d.family, "payload", string(res.Payload))
	}
	start := time.Now()
	if err := d.write(ctx, res); err != nil {
		d.metrics.restoreFailures.Inc()
		if !full {
			d.metrics.partialRestoreFailures.Inc()
		}
		return fmt.Errorf("writing %s rules (%d bytes): %w", d.family, len(res.Payload), err)
	}
	klog.V(4).InfoS("iptables-restore done", "ipFamily", d.family, "full", res.Full, "bytes", len(res.Payload), "elapsed", time.Since(start))
	renderer.Shrink()
	if full {
		d.lastFull = start
	}
	d.state.Succeeded(s, snap)
	for table, n := range res.Rules {
		d.metrics.rulesLast.WithLabelValues(table).Set(float64(n))
	}
	for table, n := range res.RulesTotal {
		d.metrics.rulesTotal.WithLabelValues(table).Set(float64(n))
	}
	syncstate.CleanConntrack(d.cleaner, d.family, snap, res.Full, changed)
	return nil
}

// ensureCounters creates upstream's nfacct counters, as upstream does on every full sync, and reports
// which exist. A counter that cannot be created is logged and left out of the rules, whose packets then
// go uncounted: its metric stops growing.
func (d *Dataplane) ensureCounters() NFAcct {
	if d.acct == nil {
		return NFAcct{}
	}
	ensure := func(name string) bool {
		if err := d.acct.Ensure(name); err != nil {
			klog.ErrorS(err, "Could not create an nfacct counter; its metric will not be updated", "counter", name, "ipFamily", d.family)
			return false
		}
		return true
	}
	return NFAcct{InvalidDropped: ensure(CounterInvalidDropped), LocalhostNodePorts: ensure(CounterLocalhostNodePorts)}
}

// write restores a render: its chunks one after the other, or the payload at once; nothing when there is
// nothing to write.
func (d *Dataplane) write(ctx context.Context, res *Result) error {
	if len(res.Chunks) == 0 {
		if len(res.Payload) == 0 {
			klog.V(4).InfoS("Nothing to write", "ipFamily", d.family)
			return nil
		}
		return d.kernel.Restore(ctx, res.Payload)
	}
	for i, c := range res.Chunks {
		if err := d.kernel.Restore(ctx, c); err != nil {
			return fmt.Errorf("transaction %d of %d: %w", i+1, len(res.Chunks), err)
		}
	}
	return nil
}

// ensureBase creates our chains that built-in chains jump to, the jump rules themselves, and the canary
// chains, as upstream does on every full sync. It names the first nat jump rule it had to add back (the
// ones the watcher checks), "" when none.
func (d *Dataplane) ensureBase(cfg Config) (readded string, err error) {
	for _, c := range CanaryChains() {
		if err := d.kernel.EnsureChain(c.Table, c.Chain); err != nil {
			return "", err
		}
	}
	for _, j := range JumpRules(cfg) {
		if err := d.kernel.EnsureChain(j.Table, j.Target); err != nil {
			return "", err
		}
		added, err := d.kernel.EnsureRule(true, j.Table, j.Chain, j.RuleSpec()...)
		if err != nil {
			return "", err
		}
		if added && j.Table == "nat" && readded == "" {
			readded = j.Table + "/" + j.Chain + " -j " + j.Target
		}
	}
	return readded, nil
}

// existingChains lists the chains of the nat and filter tables, so a full render can delete stale ones.
func (d *Dataplane) existingChains(ctx context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	for _, table := range []string{"nat", "filter"} {
		chains, err := d.kernel.ListChains(ctx, table)
		if err != nil {
			return nil, fmt.Errorf("listing %s chains: %w", d.family, err)
		}
		out[table] = chains
	}
	return out, nil
}

// Stop does nothing: the kernel carries mode iptables' traffic, and the rules stay when the daemon stops.
func (d *Dataplane) Stop(context.Context) {}

// Watch checks every interval that our canary chains and the jumps into KUBE-SERVICES and
// KUBE-POSTROUTING are still there; when someone removed them (a firewall reload, `iptables -F`), it logs
// once, counts it, and asks for a full sync through sync.
func (d *Dataplane) Watch(ctx context.Context, interval time.Duration, sync func(full bool)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		d.checkMu.Lock()
		d.mu.Lock()
		synced := d.state.Synced()
		cfg := d.cfg
		d.mu.Unlock()
		removed := synced && d.noteRemoved(cfg) // not synced: a full sync is already due
		if removed {
			d.state.MarkFull()
		}
		d.checkMu.Unlock()
		if removed {
			sync(true)
		}
	}
}

// noteRemoved logs and counts our canary chains or jump rules gone missing, and reports whether they were.
// Call it with checkMu held.
func (d *Dataplane) noteRemoved(cfg Config) bool {
	missing := d.missing(cfg)
	if missing == "" {
		return false
	}
	d.countRemoved(missing)
	return true
}

// countRemoved logs and counts one removal of our rules by someone else.
func (d *Dataplane) countRemoved(missing string) {
	syncstate.ChangedExternally(d.metrics.rulesRemoved, d.family, "iptables rules", missing+" is missing")
}

// missing names the first canary chain or essential jump rule that is gone ("" when all are there).
func (d *Dataplane) missing(cfg Config) string {
	for _, c := range CanaryChains() {
		if ok, err := d.kernel.ChainExists(c.Table, c.Chain); err == nil && !ok {
			return c.Table + "/" + c.Chain
		}
	}
	for _, j := range JumpRules(cfg) {
		if j.Table != "nat" {
			continue
		}
		ok, err := d.kernel.RuleExists(j.Table, j.Chain, j.RuleSpec()...)
		if err == nil && !ok {
			return j.Table + "/" + j.Chain + " -j " + j.Target
		}
	}
	return ""
}

// Metrics are the iptables dataplane's metrics, under upstream's names where upstream has them.
type Metrics struct {
	restoreFailures        *prometheus.CounterVec
	partialRestoreFailures *prometheus.CounterVec
	rulesTotal             *prometheus.GaugeVec
	rulesLast              *prometheus.GaugeVec
	rulesRemoved           *prometheus.CounterVec
	backend                *prometheus.GaugeVec
}

// Accounting is the node's nfacct subsystem (an *nfacct.Client): the Dataplane creates upstream's
// counters in it, the metrics read them.
type Accounting interface {
	Ensure(name string) error
	Get(name string) (nfacct.Counter, error)
}

// The descriptions of upstream's two metrics read from nfacct counters at every scrape.
var (
	invalidDroppedDesc = prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		"[ALPHA] packets dropped by iptables to work around conntrack problems", nil, nil)
	localhostAcceptedDesc = prometheus.NewDesc("kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
		"[ALPHA] Number of packets accepted on nodeports of loopback interface", nil, nil)
)

// NewMetrics registers the iptables metrics on reg; with acct (nil when the kernel has no nfacct) also
// upstream's two metrics that report what the rules counted in its nfacct counters, as upstream
// registers them only when it can reach nfacct.
func NewMetrics(reg prometheus.Registerer, acct Accounting) *Metrics {
	const sub = "kubeproxy"
	m := &Metrics{
		restoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "sync_proxy_rules_iptables_restore_failures_total", Help: "[ALPHA] Cumulative proxy iptables restore failures"}, []string{"ip_family"}),
		partialRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "sync_proxy_rules_iptables_partial_restore_failures_total", Help: "[ALPHA] Cumulative proxy iptables partial restore failures"}, []string{"ip_family"}),
		rulesTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub,
			Name: "sync_proxy_rules_iptables_total", Help: "[ALPHA] Total number of iptables rules owned by kube-proxy"}, []string{"table", "ip_family"}),
		rulesLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub,
			Name: "sync_proxy_rules_iptables_last", Help: "[ALPHA] Number of iptables rules written by kube-proxy in last sync"}, []string{"table", "ip_family"}),
		rulesRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub,
			Name: "iptables_rules_removed_externally_total", Help: "Times our canary chains or jump rules were found removed by someone else (a full sync restored them)"}, []string{"ip_family"}),
		backend: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub,
			Name: "iptables_backend_info", Help: "The iptables backend in use (nft or legacy), as a label"}, []string{"backend", "ip_family"}),
	}
	reg.MustRegister(m.restoreFailures, m.partialRestoreFailures, m.rulesTotal, m.rulesLast, m.rulesRemoved, m.backend)
	if acct != nil {
		reg.MustRegister(nfacct.NewCollector(acct, CounterInvalidDropped, invalidDroppedDesc),
			nfacct.NewCollector(acct, CounterLocalhostNodePorts, localhostAcceptedDesc))
	}
	return m
}

// SetBackend records the backend in use for a family.
func (m *Metrics) SetBackend(backend string, family v1.IPFamily) {
	m.backend.WithLabelValues(backend, string(family)).Set(1)
}

type familyMetrics struct {
	restoreFailures, partialRestoreFailures, rulesRemoved prometheus.Counter
	rulesTotal, rulesLast                                 *prometheus.GaugeVec
}

func (m *Metrics) forFamily(f v1.IPFamily) *familyMetrics {
	l := prometheus.Labels{"ip_family": string(f)}
	return &familyMetrics{
		restoreFailures:        m.restoreFailures.With(l),
		partialRestoreFailures: m.partialRestoreFailures.With(l),
		rulesRemoved:           m.rulesRemoved.With(l),
		rulesTotal:             m.rulesTotal.MustCurryWith(l),
		rulesLast:              m.rulesLast.MustCurryWith(l),
	}
}
