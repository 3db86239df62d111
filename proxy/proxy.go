package proxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
)

// Dataplane programs the kernel for one IP family: a mode (iptables, ipvs, nftables, userspace) implements
// it once per family, and the Proxy drives it. Every mode implements all of it, so the Proxy never asks
// what a dataplane can do; a mode with nothing to do in a method returns at once.
type Dataplane interface {
	// Apply makes the kernel match snap. When full is false the dataplane may rewrite only what changed
	// since the last snapshot it applied successfully (see Snapshot.Changes); after any failure of its own
	// it must treat the next call as full. It must leave working rules in place when it fails.
	Apply(ctx context.Context, snap *Snapshot, full bool) error
	// Reconfigure takes a reloaded configuration whose fields may change the rules (masqueradeAll,
	// clusterCIDR, nodePortAddresses, ...). It is called on the sync goroutine, before the full sync that
	// applies the new configuration; an error keeps the old one.
	Reconfigure(cfg *config.KubeProxyConfiguration) error
	// Watch watches the dataplane's kernel state between syncs until ctx is done, calling sync to ask for
	// one, full when its state was removed behind its back (a firewall reload flushing iptables, say).
	// interval is the sync period. A dataplane with nothing to watch returns at once.
	Watch(ctx context.Context, interval time.Duration, sync func(full bool))
	// Stop finishes what the dataplane has under way when the daemon stops (mode userspace: the
	// connections its proxy engine carries). It is called once the sync loop has ended, must return by
	// ctx's deadline, and must leave the rules in place.
	Stop(ctx context.Context)
}

// stopTimeout bounds the dataplanes' Stop (main gives the whole stop 1.5 s).
var stopTimeout = time.Second

// Options configure a Proxy.
type Options struct {
	// NodeName is this node's name.
	NodeName string
	// Dataplanes holds one Dataplane per IP family to program, primary family first.
	Dataplanes []FamilyDataplane
	// SyncPeriod and MinSyncPeriod bound the sync frequency (see Runner).
	SyncPeriod, MinSyncPeriod time.Duration
	// ExternalIPs is the AllowServiceExternalIPs feature gate.
	ExternalIPs bool
	// Registry receives the proxy's metrics.
	Registry prometheus.Registerer
	// OnApplied, if set, is called after each successful Apply with the snapshot that was applied (for
	// example to update the health-check node port servers). It runs on the sync goroutine.
	OnApplied func(*Snapshot)
}

// FamilyDataplane pairs a Dataplane with the IP family it programs.
type FamilyDataplane struct {
	Family    v1.IPFamily
	Dataplane Dataplane
}

// Proxy connects the Tracker, the Runner and the Dataplanes: each sync takes the pending changes as
// snapshots, applies each family's snapshot, then reports (metrics, health).
type Proxy struct {
	opts    Options
	tracker *Tracker
	runner  *Runner
	metrics *Metrics
	health  *Health

	readyOnce sync.Once
	ready     chan struct{}

	// dataplanes holds opts.Dataplanes by family, which is how each sync pairs them with its snapshots.
	dataplanes map[v1.IPFamily]Dataplane

	mu   sync.Mutex
	last map[v1.IPFamily]*Snapshot
	// reload is a reloaded configuration for the dataplanes, picked up by the next sync.
	reload *pendingConfig
}

// New returns a Proxy. Feed it events through Tracker (or Run, which starts the API watches) and start syncing
// with Run.
func New(o Options) *Proxy {
	p := &Proxy{opts: o, ready: make(chan struct{}), last: map[v1.IPFamily]*Snapshot{},
		dataplanes: make(map[v1.IPFamily]Dataplane, len(o.Dataplanes))}
	families := make([]v1.IPFamily, 0, len(o.Dataplanes))
	for _, d := range o.Dataplanes {
		families = append(families, d.Family)
		p.dataplanes[d.Family] = d.Dataplane
	}
	p.metrics = NewMetrics(o.Registry)
	for _, f := range families {
		p.metrics.SyncFailures.WithLabelValues(string(f)) // 0 from the start, so that rate() and alerts see it
	}
	p.tracker = NewTracker(TrackerOptions{
		NodeName:    o.NodeName,
		Families:    families,
		ExternalIPs: o.ExternalIPs,
		OnChange:    p.queue,
		Problems:    func(kind string) { p.metrics.SkippedObjects.WithLabelValues(kind).Inc() },
	})
	registerTrackerMetrics(o.Registry, p.tracker)
	p.runner = NewRunner(p.sync, o.MinSyncPeriod, o.SyncPeriod)
	p.health = NewHealth(2*o.SyncPeriod, p.tracker.Node, p.metrics)
	return p
}

// Tracker returns the change tracker that events are fed into.
func (p *Proxy) Tracker() *Tracker { return p.tracker }

// Metrics returns the proxy metrics (for reload accounting).
func (p *Proxy) Metrics() *Metrics { return p.metrics }

// Health returns the health tracker whose Handler serves /healthz and /livez.
func (p *Proxy) Health() *Health { return p.health }

// Ready is closed once the API watches have listed everything and the first sync has succeeded for every family.
func (p *Proxy) Ready() <-chan struct{} { return p.ready }

// queue is called for every event that may change a snapshot.
func (p *Proxy) queue() {
	for _, d := range p.opts.Dataplanes {
		p.health.Queued(d.Family)
		p.metrics.LastQueuedTimestamp.WithLabelValues(string(d.Family)).SetToCurrentTime()
	}
	p.runner.Request(false)
}

// SetSyncPeriods applies new sync periods (a live reload).
func (p *Proxy) SetSyncPeriods(syncPeriod, minSyncPeriod time.Duration) {
	p.runner.SetIntervals(minSyncPeriod, syncPeriod)
	p.health.SetTimeout(2 * syncPeriod)
}

// Reconfigure hands a reloaded configuration to the dataplanes and waits for the full sync that applies it.
// running is the configuration in force, given back to the dataplanes that took cfg when another refuses
// it. An error for which IsRefused is true means a dataplane refused cfg, and the sync went on with the
// running one; any other error is a failure of that sync, with cfg in force and the sync retried as after
// any failure.
func (p *Proxy) Reconfigure(ctx context.Context, cfg, running *config.KubeProxyConfiguration) error {
	pc := &pendingConfig{cfg: cfg, running: running, result: make(chan error, 1)}
	p.mu.Lock()
	p.reload = pc
	p.mu.Unlock()
	// A sync already running may take pc (and its result is in before the sync waited for here starts).
	err := p.runner.SyncNow(ctx, true)
	select {
	case refused := <-pc.result:
		if refused != nil {
			return refused
		}
		return err
	default:
		if err == nil {
			err = errors.New("the configuration was not picked up by the sync")
		}
		return err
	}
}

// pendingConfig is a reloaded configuration on its way to the dataplanes; result receives the outcome
// (nil or a *refusedError) once a sync has offered it to them.
type pendingConfig struct {
	cfg, running *config.KubeProxyConfiguration
	result       chan error
}

// refusedError is a reloaded configuration that a dataplane did not accept.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// IsRefused reports whether err, from Reconfigure, says a dataplane refused the configuration.
func IsRefused(err error) bool {
	var r *refusedError
	return errors.As(err, &r)
}

// reconfigure offers a pending configuration to the dataplanes: it goes to all of them or, when one
// refuses it, to none. A refusal is the reload's outcome, not a failure of the sync.
func (p *Proxy) reconfigure() {
	p.mu.Lock()
	pc := p.reload
	p.reload = nil
	p.mu.Unlock()
	if pc == nil {
		return
	}
	var errs []error
	var took []FamilyDataplane
	for _, d := range p.opts.Dataplanes {
		if err := d.Dataplane.Reconfigure(pc.cfg); err != nil {
			errs = append(errs, fmt.Errorf("reconfiguring the %s dataplane: %w", d.Family, err))
		} else {
			took = append(took, d)
		}
	}
	if len(errs) == 0 {
		pc.result <- nil
		return
	}
	if pc.running != nil {
		for _, d := range took {
			if err := d.Dataplane.Reconfigure(pc.running); err != nil {
				klog.ErrorS(err, "Could not put the running configuration back", "ipFamily", d.Family)
			}
		}
	}
	pc.result <- &refusedError{errors.Join(errs...)}
}

// SyncNow runs a sync (full if asked) and waits for it, e.g. to make a reload take effect before it is
// reported done.
func (p *Proxy) SyncNow(ctx context.Context, full bool) error { return p.runner.SyncNow(ctx, full) }

// LoopAlive reports whether the sync loop turns, for the systemd watchdog: no sync has been running for
// longer than the health timeout. It says nothing of whether the kernel accepted the last write: a
// restart cannot fix a kernel or a rule that refuses a write, and a restart loop on every node would only
// reload the API server; that state is shown by /healthz, the STATUS line, the log and
// kubeproxy_sync_proxy_rules_failures_total instead.
func (p *Proxy) LoopAlive() bool {
	p.health.mu.Lock()
	timeout := p.health.timeout
	p.health.mu.Unlock()
	return p.runner.RunningFor() < timeout
}

// SyncFailures returns the number of consecutive failed syncs, when the first of them ended, and the last
// one's error (0, zero time and nil while syncs succeed).
func (p *Proxy) SyncFailures() (n int, since time.Time, last error) { return p.runner.FailureState() }

// Loop runs the sync loop, and the dataplanes' watchers, until ctx is done. Call it once the API watches
// have synced.
func (p *Proxy) Loop(ctx context.Context) {
	for _, d := range p.opts.Dataplanes {
		go d.Dataplane.Watch(ctx, p.opts.SyncPeriod, p.runner.Request)
	}
	p.runner.Loop(ctx)
	p.stopDataplanes()
}

// stopDataplanes calls every dataplane's Stop, the families at once, within stopTimeout.
func (p *Proxy) stopDataplanes() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, d := range p.opts.Dataplanes {
		wg.Go(func() { d.Dataplane.Stop(ctx) })
	}
	wg.Wait()
}

// sync is the Runner's SyncFunc: snapshot → apply per family → report.
func (p *Proxy) sync(ctx context.Context, full bool) error {
	start := time.Now()
	if syncFault != nil {
		syncFault()
	}
	p.reconfigure()
	build := p.tracker.Snapshots()
	var errs []error
	var failed Build
	for _, snap := range build.Snapshots {
		dp := p.dataplanes[snap.Family]
		family := string(snap.Family)
		t0 := time.Now()
		var err error
		if applyFault != nil {
			err = applyFault(snap.Family)
		}
		if err == nil {
			err = safeApply(ctx, dp, snap, full)
		}
		if err != nil {
			// The changes stay queued (their health clock keeps running, as upstream's does); a failure
			// with nothing queued does not make the node unhealthy.
			errs = append(errs, fmt.Errorf("applying %s snapshot %d: %w", snap.Family, snap.Generation, err))
			p.metrics.SyncFailures.WithLabelValues(family).Inc()
			if failed.Triggers == nil {
				failed.Triggers = map[v1.IPFamily][]time.Time{}
			}
			failed.Triggers[snap.Family] = build.Triggers[snap.Family]
			continue
		}
		elapsed := time.Since(t0)
		p.metrics.SyncDuration.WithLabelValues(family).Observe(seconds(elapsed))
		if full {
			p.metrics.SyncFullDuration.WithLabelValues(family).Observe(seconds(elapsed))
		} else {
			p.metrics.SyncPartialDuration.WithLabelValues(family).Observe(seconds(elapsed))
		}
		p.metrics.LastSyncTimestamp.WithLabelValues(family).SetToCurrentTime()
		now := time.Now()
		for _, t := range build.Triggers[snap.Family] {
			p.metrics.NetworkProgramming.WithLabelValues(family).Observe(seconds(now.Sub(t)))
		}
		p.reportLocal(snap)
		p.health.Updated(snap.Family)
		p.mu.Lock()
		p.last[snap.Family] = snap
		p.mu.Unlock()
		if p.opts.OnApplied != nil {
			p.opts.OnApplied(snap)
		}
		klog.V(2).InfoS("Synced", "ipFamily", family, "full", full, "services", len(snap.Services),
			"changed", len(snap.changed), "generation", snap.Generation, "elapsed", elapsed)
	}
	if len(errs) > 0 {
		p.tracker.RequeueTriggers(failed)
		return errors.Join(errs...)
	}
	p.readyOnce.Do(func() {
		klog.InfoS("First sync done; proxy is ready", "elapsed", time.Since(start))
		close(p.ready)
		steadyStateGC()
	})
	if full {
		// A full sync builds everything anew and leaves much garbage; hand the memory back now rather than
		// keep it in the heap until the next one.
		debug.FreeOSMemory()
	}
	return nil
}

// safeApply turns a panic in a dataplane's Apply into an error, so that the other families are still
// applied and this one's changes are requeued like after any failure (the next sync is full).
func safeApply(ctx context.Context, dp Dataplane, snap *Snapshot, full bool) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
			klog.ErrorS(err, "Dataplane panicked; the sync will be retried in full", "ipFamily", snap.Family, "stack", string(debug.Stack()))
		}
	}()
	return dp.Apply(ctx, snap, full)
}

// steadyGCPercent is the garbage collector's target heap growth once the first sync is done.
const steadyGCPercent = 25

// steadyStateGC tightens the garbage collector for the steady state, unless GOGC was set. Listing and
// the first sync allocate much and briefly, and run at Go's default (100%: the heap may grow to twice what
// is live before a collection). Afterwards each change allocates little (a snapshot's map, one Service's
// rules) while what is live is large (every Service's state); at 100% the heap, and with it the RSS,
// would settle at twice the live size for no benefit. At 25% a collection runs every few changes at
// 10,000 Services and costs a few milliseconds of CPU each (BENCHMARKS.md).
func steadyStateGC() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	debug.SetGCPercent(steadyGCPercent)
}

// reportLocal updates the count of Local-policy Services without local endpoints. Like upstream, only
// Services that have endpoints somewhere count (those without any are rejected, not dropped).
func (p *Proxy) reportLocal(snap *Snapshot) {
	var internal, external int
	for _, sp := range snap.Services {
		if len(sp.LocalEndpoints) > 0 || !sp.HasAnyEndpoints {
			continue
		}
		if sp.InternalPolicyLocal {
			internal++
		}
		if sp.ExternalPolicyLocal {
			external++
		}
	}
	p.metrics.NoLocalEndpoints.WithLabelValues("internal", string(snap.Family)).Set(float64(internal))
	p.metrics.NoLocalEndpoints.WithLabelValues("external", string(snap.Family)).Set(float64(external))
}

// LastApplied returns the last successfully applied snapshot of family (nil before the first).
func (p *Proxy) LastApplied(family v1.IPFamily) *Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last[family]
}
