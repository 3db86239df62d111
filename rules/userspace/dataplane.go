package userspace

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/internal/syncstate"
)

// kernel is what the dataplane needs from the iptables tools; xtables.Runner implements it.
type kernel interface {
	Restore(ctx context.Context, payload []byte) error
	EnsureChain(table, chain string) error
	EnsureRule(prepend bool, table, chain string, rule ...string) (bool, error)
}

// flowCleaner deletes UDP conntrack entries that still send a Service's packets to a listener port that
// is no longer that Service's.
type flowCleaner interface {
	Clean(dsts []Destination) error
}

// Dataplane is mode userspace for one IP family: the engine's listeners and the capture rules.
type Dataplane struct {
	family  v1.IPFamily
	kernel  kernel
	engine  *engine.Engine
	cleaner flowCleaner

	// mu guards cfg; state is taken after it (its lock is a leaf).
	mu  sync.Mutex
	cfg Config
	// state: whether the next sync must be full (after a failure or a SetConfig).
	state syncstate.State
	// udpPorts are the UDP listener ports the last successful sync pointed rules at.
	udpPorts map[engine.Key]uint16
	// written is the payload of the last successful write: a partial sync whose payload is the same (an
	// endpoint change, which only the engine sees) writes nothing.
	written []byte
}

var _ proxy.Dataplane = (*Dataplane)(nil)

// NewDataplane returns the dataplane of cfg.Family, writing rules through k and proxying with e. c may be
// nil (no conntrack cleanup).
func NewDataplane(cfg Config, k kernel, e *engine.Engine, c flowCleaner) *Dataplane {
	return &Dataplane{family: cfg.Family, kernel: k, engine: e, cleaner: c, cfg: cfg}
}

// Engine returns the proxy engine.
func (d *Dataplane) Engine() *engine.Engine { return d.engine }

// SetConfig replaces the rules configuration; the next sync is full.
func (d *Dataplane) SetConfig(cfg Config) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfg = cfg
	d.state.Reconfigured()
}

// Apply opens the listeners snap needs and updates their endpoints, rewrites the capture chains to point at
// them, then closes the listeners no rule points at any more. A failed rule write leaves the old rules and
// the listeners they point at; the next sync is full.
func (d *Dataplane) Apply(ctx context.Context, snap *proxy.Snapshot, full bool) error {
	d.mu.Lock()
	cfg := d.cfg
	s := d.state.Begin()
	d.mu.Unlock()
	full = full || s.Full

	start := time.Now()
	targets := Targets(snap)
	ports := make(map[engine.Key]uint16, len(targets))
	var errs []error
	for _, k := range slices.SortedFunc(maps.Keys(targets), compareKeys) {
		p, err := d.engine.Ensure(k, targets[k])
		if err != nil {
			// Its Service port is rejected as one without endpoints; the others are served.
			errs = append(errs, err)
			continue
		}
		ports[k] = p
	}
	if full {
		if err := d.ensureJumps(); err != nil {
			return err
		}
	}
	payload := Render(cfg, snap, func(k engine.Key) uint16 { return ports[k] })
	if klog.V(9).Enabled() {
		klog.V(9).InfoS("iptables-restore payload", "ipFamily", d.family, "payload", string(payload))
	}
	wrote := full || !bytes.Equal(payload, d.written)
	if wrote {
		d.written = nil // unknown until this write succeeds
		if err := d.kernel.Restore(ctx, payload); err != nil {
			return fmt.Errorf("writing %s userspace capture rules: %w", d.family, err)
		}
		d.written = payload
	}
	for _, k := range d.engine.Keys() {
		if _, ok := ports[k]; !ok {
			d.engine.Remove(k)
		}
	}
	d.cleanFlows(snap, ports)
	d.state.Succeeded(s, snap)
	klog.V(2).InfoS("Userspace proxy synced", "ipFamily", d.family, "listeners", len(ports), "full", full, "rulesWritten", wrote, "elapsed", time.Since(start))
	if len(errs) > 0 {
		klog.ErrorS(fmt.Errorf("%v", errs), "Some Service ports could not get a listener; they are rejected", "ipFamily", d.family)
	}
	return nil
}

// cleanFlows deletes UDP conntrack entries still pointing at listener ports that changed (after a restart
// above all, when every port is new), and those that a client's first datagrams created before the
// listener of their destination opened (no redirect then), so that its next datagram reaches the current
// listener instead of a closed port or nothing, as the kernel modes clear a Service's UDP entries when it
// gains endpoints.
func (d *Dataplane) cleanFlows(snap *proxy.Snapshot, ports map[engine.Key]uint16) {
	udp := map[engine.Key]uint16{}
	for k, p := range ports {
		if k.Protocol == v1.ProtocolUDP {
			udp[k] = p
		}
	}
	if d.cleaner == nil || maps.Equal(udp, d.udpPorts) {
		d.udpPorts = udp
		return
	}
	before := d.udpPorts
	d.udpPorts = udp
	opened := func(k engine.Key) bool { _, had := before[k]; return !had }
	if err := d.cleaner.Clean(Destinations(snap, ports, opened)); err != nil {
		klog.ErrorS(err, "Could not delete stale UDP conntrack entries of the userspace proxy", "ipFamily", d.family)
	}
}

// Stop drains the proxy engine when the daemon stops: no new connections or datagrams are taken (a
// listener whose socket is in the service manager's store keeps them queued for the next process), and
// those under way may finish until ctx is done. The rules stay in place.
func (d *Dataplane) Stop(ctx context.Context) {
	start := time.Now()
	left := d.engine.Drain(ctx)
	klog.InfoS("Userspace proxy drained", "ipFamily", d.family, "elapsed", time.Since(start), "cutShort", left)
}

// Watch returns at once: mode userspace does not watch the kernel between syncs; its syncs alone put its
// capture rules back: every full sync (each sync period) writes them all.
func (d *Dataplane) Watch(context.Context, time.Duration, func(full bool)) {}

func (d *Dataplane) ensureJumps() error {
	for table, chains := range Chains() {
		for _, c := range chains {
			if err := d.kernel.EnsureChain(table, c); err != nil {
				return err
			}
		}
	}
	for _, j := range JumpRules() {
		if _, err := d.kernel.EnsureRule(true, j.Table, j.Chain, j.RuleSpec()...); err != nil {
			return fmt.Errorf("ensuring jump %s/%s -> %s: %w", j.Table, j.Chain, j.Target, err)
		}
	}
	return nil
}

func compareKeys(a, b engine.Key) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	if c := strings.Compare(string(a.Protocol), string(b.Protocol)); c != 0 {
		return c
	}
	return strings.Compare(a.Policy, b.Policy)
}
