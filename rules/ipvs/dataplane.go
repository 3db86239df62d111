package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
)

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

// Dataplane programs IPVS mode for one IP family: IPVS virtual and real servers, the addresses on
// kube-ipvs0, the ipsets and the iptables rules that match them. It implements proxy.Dataplane and
// proxy.Reconfigurer.
type Dataplane struct {
	family v1.IPFamily
	k      kernel
	clean  cleaner
	opts   options

	restoreFailures prometheus.Counter

	mu  sync.Mutex
	cfg Config
	// want is what the last snapshot wants; have is what the kernel holds as far as we know (read at full
	// syncs, updated by every successful write).
	want *desired
	have *model
	en   env
	// last is the last snapshot applied without error; needFull forces the next Apply to be full.
	last     *proxy.Snapshot
	needFull bool
	// rules is the iptables payload last restored.
	rules []byte
	// draining holds the TCP real servers removed from the plan that still had connections: weight 0 until
	// they have none or their deadline passes.
	draining map[vsKey]map[realKey]time.Time
	// phases times the steps of the current sync, for the log.
	phases phaseTimer
}

// phaseTimer records how long the steps of a sync take.
type phaseTimer struct {
	last  time.Time
	steps []string
}

func (p *phaseTimer) start() { p.last, p.steps = time.Now(), p.steps[:0] }

func (p *phaseTimer) done(step string) {
	now := time.Now()
	p.steps = append(p.steps, step+"="+now.Sub(p.last).Round(time.Millisecond).String())
	p.last = now
}

var (
	_ proxy.Dataplane    = (*Dataplane)(nil)
	_ proxy.Reconfigurer = (*Dataplane)(nil)
)

// model is what the kernel holds, as far as the dataplane knows.
type model struct {
	vs    map[vsKey]*modelVS
	binds map[netip.Addr]bool
	sets  [numSets]map[entry]bool
}

type modelVS struct {
	kernelVS
	reals map[realKey]uint32 // weight
}

func newModel() *model {
	m := &model{vs: map[vsKey]*modelVS{}, binds: map[netip.Addr]bool{}}
	for i := range m.sets {
		m.sets[i] = map[entry]bool{}
	}
	return m
}

// newDataplane wires a Dataplane to its kernel handles; New does so with the real ones.
func newDataplane(ctx context.Context, cfg Config, k kernel, cl cleaner, reg prometheus.Registerer, opt ...Option) (*Dataplane, error) {
	o := options{drainTimeout: DefaultDrainTimeout, drainInterval: DefaultDrainInterval, now: time.Now}
	for _, f := range opt {
		f(&o)
	}
	d := &Dataplane{family: cfg.Family, k: k, clean: cl, opts: o, cfg: cfg, want: newDesired(), have: newModel(),
		needFull: true, draining: map[vsKey]map[realKey]time.Time{}}
	if reg != nil {
		d.restoreFailures = restoreFailures(reg).WithLabelValues(string(cfg.Family))
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

var (
	restoreFailuresMu  sync.Mutex
	restoreFailuresFor = map[prometheus.Registerer]*prometheus.CounterVec{}
)

// restoreFailures returns the iptables-restore failure counter of a registry, registering it once (both
// families' dataplanes share it).
func restoreFailures(reg prometheus.Registerer) *prometheus.CounterVec {
	restoreFailuresMu.Lock()
	defer restoreFailuresMu.Unlock()
	if c, ok := restoreFailuresFor[reg]; ok {
		return c
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "kubeproxy",
		Name: "sync_proxy_rules_iptables_restore_failures_total", Help: "Cumulative proxy iptables restore failures"},
		[]string{"ip_family"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				c = existing
			}
		}
	}
	restoreFailuresFor[reg] = c
	return c
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
	k := vsKey{probeAddr, 20000, protoTCP}
	_ = h.removeService(k)
	if err := h.createService(kernelVS{key: k, scheduler: scheduler}); err != nil {
		return err
	}
	return h.removeService(k)
}

// setSysctls writes the sysctls IPVS mode needs, each only when it differs.
func (d *Dataplane) setSysctls() error {
	want := []struct{ name, value string }{
		// Keep conntrack entries for IPVS connections, so iptables' masquerading works on them.
		{"net/ipv4/vs/conntrack", "1"},
		// Expire a connection whose real server was deleted on its next packet, instead of dropping
		// packets until it times out.
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		// Expire persistence templates of real servers with weight 0 (draining).
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		{"net/ipv4/ip_forward", "1"},
	}
	// conn_reuse_mode=0 avoided a 1 s delay on reused ports before kernel 5.9 fixed it; upstream sets it on
	// kernels from 4.1 to 5.8 and leaves it alone otherwise.
	if v := d.k.kernelVersion; (v[0] > 4 || v[0] == 4 && v[1] >= 1) && (v[0] < 5 || v[0] == 5 && v[1] < 9) {
		want = append(want, struct{ name, value string }{"net/ipv4/vs/conn_reuse_mode", "0"})
	}
	if d.cfg.StrictARP {
		want = append(want, struct{ name, value string }{"net/ipv4/conf/all/arp_ignore", "1"},
			struct{ name, value string }{"net/ipv4/conf/all/arp_announce", "2"})
	}
	for _, s := range want {
		cur, err := d.k.sysctl.get(s.name)
		if err != nil {
			return fmt.Errorf("reading sysctl %s: %w", s.name, err)
		}
		if cur == s.value {
			continue
		}
		if err := d.k.sysctl.set(s.name, s.value); err != nil {
			return fmt.Errorf("setting sysctl %s=%s: %w", s.name, s.value, err)
		}
		klog.V(1).InfoS("Set sysctl", "name", s.name, "value", s.value, "was", cur)
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

// Reconfigure takes a reloaded configuration; the next Apply is full and applies it. A scheduler the
// kernel does not have, or a sysctl or IPVS timeout the kernel refuses, is an error, and the old
// configuration stays.
func (d *Dataplane) Reconfigure(cfg *config.KubeProxyConfiguration) error {
	c, err := NewConfig(cfg, d.family)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c.Scheduler != d.cfg.Scheduler {
		if err := probeScheduler(d.k.ipvs, c.Scheduler); err != nil {
			return fmt.Errorf("ipvs.scheduler %s is not usable (module ip_vs_%s): %w", c.Scheduler, c.Scheduler, err)
		}
	}
	old := d.cfg
	d.cfg = c
	err = d.setSysctls()
	if err == nil {
		err = d.setTimeouts()
	}
	if err != nil {
		// Refused as a whole: the rules keep being written from the running configuration.
		d.cfg = old
		return err
	}
	d.needFull = true
	return nil
}

// Apply makes the kernel match snap. A full Apply reads the kernel's state and repairs every difference;
// a partial one re-plans the Service ports that changed since the last successful Apply and writes only
// what they changed. After any failure the next Apply is full.
func (d *Dataplane) Apply(ctx context.Context, snap *proxy.Snapshot, full bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	d.phases.start()
	full = full || d.needFull || d.last == nil || !d.last.Node.Equal(&snap.Node)
	d.needFull = true
	var changed []proxy.ServicePortName
	var err error
	if full {
		err = d.syncFull(ctx, snap)
	} else {
		changed = snap.Changes(d.last)
		err = d.syncPartial(ctx, snap, changed)
	}
	if err != nil {
		return err
	}
	d.needFull = false
	d.last = snap
	if d.clean != nil && (full || conntrack.Affected(changed)) {
		if err := d.clean.Clean(snap); err != nil {
			klog.ErrorS(err, "Cleaning up stale conntrack entries failed", "ipFamily", d.family)
		}
	}
	klog.V(2).InfoS("Synced IPVS", "ipFamily", d.family, "full", full, "changed", len(changed),
		"virtualServers", len(d.have.vs), "draining", len(d.draining), "elapsed", time.Since(start),
		"steps", strings.Join(d.phases.steps, " "))
	return nil
}

// plan re-plans every Service port of snap.
func (d *Dataplane) plan(snap *proxy.Snapshot) *desired {
	want := newDesired()
	for name, sp := range snap.Services {
		if p := planService(&d.cfg, &d.en, &snap.Node, sp); p != nil {
			want.set(name, p, nil)
		}
	}
	return want
}

// syncFull reads the kernel state and makes it match the plan of snap.
func (d *Dataplane) syncFull(ctx context.Context, snap *proxy.Snapshot) error {
	if err := d.k.links.ensureDummy(DummyLink); err != nil {
		return fmt.Errorf("creating the %s link: %w", DummyLink, err)
	}
	addrs, err := d.k.links.localAddrs(d.family, DummyLink)
	if err != nil {
		return fmt.Errorf("listing the node's addresses: %w", err)
	}
	d.en = newEnv(&d.cfg, &snap.Node, addrs)
	d.want = d.plan(snap)
	have := newModel()
	d.have = have
	var errs []error
	d.phases.done("plan")

	// Sets first: the rules restored below refer to them.
	for id := setID(0); id < numSets; id++ {
		if err := d.syncSet(id, have); err != nil {
			errs = append(errs, err)
		}
	}
	d.phases.done("ipsets")

	// Addresses on kube-ipvs0.
	bound, err := d.k.links.addrs(DummyLink, d.family)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the addresses of %s: %w", DummyLink, err))
	}
	for _, a := range bound {
		have.binds[a] = true
	}
	keys := make([]netip.Addr, 0, len(d.want.binds)+len(bound))
	for a := range d.want.binds {
		keys = append(keys, a)
	}
	keys = append(keys, bound...)
	slices.SortFunc(keys, netip.Addr.Compare)
	keys = slices.Compact(keys)
	errs = append(errs, d.syncBinds(keys, true)...)
	d.phases.done("addresses")

	// Virtual servers.
	list, err := d.k.ipvs.services()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing IPVS services: %w", err))...)
	}
	// All real servers in one read when the kernel offers it: one request per virtual server is what makes
	// full syncs of thousands of Services slow.
	all, err := d.k.ipvs.allReals()
	if err != nil {
		klog.V(2).InfoS("Listing all IPVS real servers at once failed; listing them per virtual server", "err", err)
		all = nil
	}
	var vsKeys []vsKey
	for _, kv := range list {
		if familyOf(kv.key.addr) != d.family {
			continue
		}
		if d.want.vs(kv.key) == nil && d.cfg.excluded(kv.key.addr) {
			continue // someone else's, left alone
		}
		m := &modelVS{kernelVS: kv}
		if d.want.vs(kv.key) != nil {
			rs, err := all[kv.key], error(nil)
			if all == nil {
				rs, err = d.k.ipvs.reals(kv.key)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("listing the real servers of %s: %w", kv.key, err))
				continue
			}
			m.reals = make(map[realKey]uint32, len(rs))
			for _, r := range rs {
				m.reals[r.key] = r.weight
			}
			if err := d.syncVS(kv.key, m, rs); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		have.vs[kv.key] = m
		vsKeys = append(vsKeys, kv.key)
	}
	for k := range d.want.claims {
		if _, ok := have.vs[k]; !ok {
			vsKeys = append(vsKeys, k)
		}
	}
	slices.SortFunc(vsKeys, vsKey.compare)
	for _, k := range vsKeys {
		if err := d.syncVS(k, nil, nil); err != nil {
			errs = append(errs, err)
		}
	}
	for k := range d.draining {
		if _, ok := have.vs[k]; !ok {
			delete(d.draining, k)
		}
	}
	d.phases.done("ipvs")
	errs = append(errs, d.syncBinds(keys, false)...)
	d.phases.done("unbind")

	if err := d.syncRules(ctx, &snap.Node, true); err != nil {
		errs = append(errs, err)
	}
	d.phases.done("iptables")
	return errors.Join(errs...)
}

// syncPartial re-plans the changed Service ports and writes what they changed.
func (d *Dataplane) syncPartial(ctx context.Context, snap *proxy.Snapshot, changed []proxy.ServicePortName) error {
	t := newTouched()
	for _, name := range changed {
		var p *servicePlan
		if sp := snap.Services[name]; sp != nil {
			p = planService(&d.cfg, &d.en, &snap.Node, sp)
		}
		d.want.set(name, p, t)
	}
	var errs []error
	for id := setID(0); id < numSets; id++ {
		if len(t.sets[id]) == 0 {
			continue
		}
		es := make([]entry, 0, len(t.sets[id]))
		for e := range t.sets[id] {
			es = append(es, e)
		}
		slices.SortFunc(es, entry.compare)
		for _, e := range es {
			if err := d.syncEntry(id, e); err != nil {
				errs = append(errs, err)
			}
		}
	}
	binds := make([]netip.Addr, 0, len(t.binds))
	for a := range t.binds {
		binds = append(binds, a)
	}
	slices.SortFunc(binds, netip.Addr.Compare)
	errs = append(errs, d.syncBinds(binds, true)...)
	keys := make([]vsKey, 0, len(t.vs))
	for k := range t.vs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, vsKey.compare)
	for _, k := range keys {
		if err := d.syncVS(k, nil, nil); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, d.syncBinds(binds, false)...)
	if err := d.syncRules(ctx, &snap.Node, false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// syncSet makes one set exist and hold what the plan wants (full syncs), recording its members in have.
func (d *Dataplane) syncSet(id setID, have *model) error {
	name, typ := setName(id, d.family), setDefs[id].typ
	cur, err := d.k.sets.listSet(name)
	if isNotExist(err) {
		if err := d.k.sets.createSet(name, typ, d.family); err != nil && !isExist(err) {
			return fmt.Errorf("creating ipset %s: %w", name, err)
		}
		cur, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("listing ipset %s: %w", name, err)
	}
	for _, e := range cur {
		have.sets[id][e] = true
	}
	var errs []error
	for _, e := range cur {
		if d.want.sets[id][e] == 0 {
			errs = append(errs, d.syncEntry(id, e))
		}
	}
	want := make([]entry, 0, len(d.want.sets[id]))
	for e := range d.want.sets[id] {
		if !have.sets[id][e] {
			want = append(want, e)
		}
	}
	slices.SortFunc(want, entry.compare)
	for _, e := range want {
		errs = append(errs, d.syncEntry(id, e))
	}
	return errors.Join(errs...)
}

// syncEntry adds or deletes one set member so the kernel matches the plan.
func (d *Dataplane) syncEntry(id setID, e entry) error {
	name, typ := setName(id, d.family), setDefs[id].typ
	want, have := d.want.sets[id][e] > 0, d.have.sets[id][e]
	switch {
	case want && !have:
		if err := d.k.sets.addEntry(name, typ, e); err != nil && !isExist(err) {
			return fmt.Errorf("adding %s to ipset %s: %w", e, name, err)
		}
		d.have.sets[id][e] = true
	case !want && have:
		if err := d.k.sets.delEntry(name, typ, e); err != nil && !isNotExist(err) {
			return fmt.Errorf("deleting %s from ipset %s: %w", e, name, err)
		}
		delete(d.have.sets[id], e)
	}
	return nil
}

// syncBinds adds (add true) or removes (add false) addresses of kube-ipvs0 so they match the plan.
// Addresses are added before the virtual servers are written and removed after.
func (d *Dataplane) syncBinds(addrs []netip.Addr, add bool) []error {
	var errs []error
	for _, a := range addrs {
		want, have := d.want.binds[a] > 0, d.have.binds[a]
		switch {
		case add && want && !have:
			if err := d.k.links.addAddr(DummyLink, a); err != nil && !isExist(err) {
				errs = append(errs, fmt.Errorf("adding %s to %s: %w", a, DummyLink, err))
				continue
			}
			d.have.binds[a] = true
		case !add && !want && have:
			if err := d.k.links.delAddr(DummyLink, a); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("removing %s from %s: %w", a, DummyLink, err))
				continue
			}
			delete(d.have.binds, a)
		}
	}
	return errs
}

// syncVS makes one virtual server and its real servers match the plan. have is the kernel's state when
// it was just read (full syncs), else nil to use the model; fresh are its real servers as just read, with
// their connection counts (nil: read them if a removal needs them).
func (d *Dataplane) syncVS(k vsKey, have *modelVS, fresh []kernelReal) error {
	if have != nil {
		d.have.vs[k] = have
	}
	have = d.have.vs[k]
	want := d.want.vs(k)
	if want == nil {
		if have == nil {
			return nil
		}
		if err := d.k.ipvs.removeService(k); err != nil && !isNotExist(err) {
			return fmt.Errorf("removing IPVS service %s: %w", k, err)
		}
		delete(d.have.vs, k)
		delete(d.draining, k)
		return nil
	}
	kv := kernelVS{key: k, scheduler: want.scheduler, flags: want.flags, timeout: want.timeout}
	switch {
	case have == nil:
		err := d.k.ipvs.createService(kv)
		if isExist(err) {
			// Created behind our back since the last full sync: take it over.
			err = d.k.ipvs.updateService(kv)
			if err == nil {
				if fresh, err = d.k.ipvs.reals(k); err != nil {
					return fmt.Errorf("listing the real servers of %s: %w", k, err)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("creating IPVS service %s: %w", k, err)
		}
		have = &modelVS{kernelVS: kv, reals: map[realKey]uint32{}}
		for _, r := range fresh {
			have.reals[r.key] = r.weight
		}
		d.have.vs[k] = have
	case !want.sameService(have.scheduler, have.flags, have.timeout):
		if err := d.k.ipvs.updateService(kv); err != nil {
			return fmt.Errorf("updating IPVS service %s: %w", k, err)
		}
		have.kernelVS = kv
	}

	var errs []error
	draining := d.draining[k]
	for _, r := range want.reals {
		w, ok := have.reals[r]
		switch {
		case !ok:
			err := d.k.ipvs.createReal(k, r, 1)
			if isExist(err) {
				err = d.k.ipvs.updateReal(k, r, 1)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("adding real server %s to %s: %w", r, k, err))
				continue
			}
		case w != 1:
			// A draining real server that is wanted again is restored.
			if err := d.k.ipvs.updateReal(k, r, 1); err != nil {
				errs = append(errs, fmt.Errorf("setting the weight of real server %s of %s: %w", r, k, err))
				continue
			}
		}
		have.reals[r] = 1
		delete(draining, r)
	}
	var gone []realKey
	for r := range have.reals {
		if _, ok := slices.BinarySearchFunc(want.reals, r, realKey.compare); !ok {
			gone = append(gone, r)
		}
	}
	slices.SortFunc(gone, realKey.compare)
	for _, r := range gone {
		if _, ok := draining[r]; ok && have.reals[r] == 0 {
			continue
		}
		if k.proto.gracefulDelete() && d.opts.drainTimeout > 0 {
			if fresh == nil {
				var err error
				if fresh, err = d.k.ipvs.reals(k); err != nil {
					errs = append(errs, fmt.Errorf("listing the real servers of %s: %w", k, err))
					break
				}
			}
			if i := slices.IndexFunc(fresh, func(f kernelReal) bool { return f.key == r }); i >= 0 && fresh[i].active+fresh[i].inactive > 0 {
				if have.reals[r] != 0 {
					if err := d.k.ipvs.updateReal(k, r, 0); err != nil {
						errs = append(errs, fmt.Errorf("draining real server %s of %s: %w", r, k, err))
						continue
					}
					have.reals[r] = 0
				}
				if draining == nil {
					draining = map[realKey]time.Time{}
					d.draining[k] = draining
				}
				if _, ok := draining[r]; !ok {
					draining[r] = d.opts.now().Add(d.opts.drainTimeout)
					klog.V(2).InfoS("Draining real server", "virtualServer", k, "realServer", r,
						"connections", fresh[i].active+fresh[i].inactive)
				}
				continue
			}
		}
		if err := d.k.ipvs.removeReal(k, r); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("removing real server %s from %s: %w", r, k, err))
			continue
		}
		delete(have.reals, r)
		delete(draining, r)
	}
	if len(draining) == 0 {
		delete(d.draining, k)
	}
	return errors.Join(errs...)
}

// syncRules restores the iptables rules when they changed, or always when force is set, and then (when
// forced) ensures the jumps into them.
func (d *Dataplane) syncRules(ctx context.Context, node *proxy.Node, force bool) error {
	payload := renderRules(&d.cfg, &ruleInputs{nonEmpty: d.want.nonEmpty(), noNodeAccess: d.want.sortedNoNodeAccess(), node: node})
	if !force && slices.Equal(payload, d.rules) {
		return nil
	}
	klog.V(9).InfoS("Restoring iptables rules", "ipFamily", d.family, "payload", string(payload))
	if err := d.k.rules.restore(ctx, payload); err != nil {
		d.rules = nil
		if d.restoreFailures != nil {
			d.restoreFailures.Inc()
		}
		return fmt.Errorf("restoring the IPVS-mode iptables rules: %w", err)
	}
	d.rules = payload
	if !force {
		return nil
	}
	var errs []error
	for _, j := range jumpRules {
		if err := d.k.rules.ensureJump(j); err != nil {
			errs = append(errs, fmt.Errorf("ensuring the jump from %s/%s to %s: %w", j.table, j.chain, j.target, err))
		}
	}
	return errors.Join(errs...)
}

// drainLoop checks the draining real servers until ctx ends.
func (d *Dataplane) drainLoop(ctx context.Context) {
	t := time.NewTicker(d.opts.drainInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.drain()
		}
	}
}

// drain deletes the draining real servers that have no connections left or whose deadline passed.
func (d *Dataplane) drain() {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.opts.now()
	for k, rs := range d.draining {
		fresh, err := d.k.ipvs.reals(k)
		if err != nil {
			klog.ErrorS(err, "Listing draining real servers failed", "virtualServer", k)
			continue
		}
		have := d.have.vs[k]
		for r, deadline := range rs {
			i := slices.IndexFunc(fresh, func(f kernelReal) bool { return f.key == r })
			if i < 0 {
				delete(rs, r)
				if have != nil {
					delete(have.reals, r)
				}
				continue
			}
			conns := fresh[i].active + fresh[i].inactive
			if conns > 0 && now.Before(deadline) {
				continue
			}
			if err := d.k.ipvs.removeReal(k, r); err != nil && !isNotExist(err) {
				klog.ErrorS(err, "Removing a drained real server failed", "virtualServer", k, "realServer", r)
				continue
			}
			klog.V(2).InfoS("Removed drained real server", "virtualServer", k, "realServer", r,
				"connections", conns, "timedOut", conns > 0)
			delete(rs, r)
			if have != nil {
				delete(have.reals, r)
			}
		}
		if len(rs) == 0 {
			delete(d.draining, k)
		}
	}
}

// Draining returns the real servers currently draining, as "vs -> real" strings, sorted (for tests and
// debugging).
func (d *Dataplane) Draining() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for k, rs := range d.draining {
		for r := range rs {
			out = append(out, k.String()+" -> "+r.String())
		}
	}
	slices.Sort(out)
	return out
}
