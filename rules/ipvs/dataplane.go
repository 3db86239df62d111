package ipvs

import (
	"context"
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
	"kube-proxy/rules/internal/syncstate"
)

// Dataplane programs IPVS mode for one IP family: IPVS virtual and real servers, the addresses on
// kube-ipvs0, the ipsets and the iptables rules that match them. It implements proxy.Dataplane.
type Dataplane struct {
	family v1.IPFamily
	k      kernel
	clean  cleaner
	opts   options

	restoreFailures prometheus.Counter

	mu  sync.Mutex
	cfg Config
	// want is the desired state of rendered, rendered with cfg and en; have is what the kernel holds as far
	// as we know (read at full syncs, updated by every successful write). rerender has the next full sync
	// render every port anew (the configuration changed).
	want     *desired
	rendered *proxy.Snapshot
	rerender bool
	have     *model
	en       env
	// state: whether the next Apply must be full, and the last snapshot applied without error. Apply holds
	// mu throughout, so no Reconfigure happens during a sync.
	state syncstate.State
	// rules is the iptables payload last restored.
	rules []byte
	// draining holds the TCP real servers removed from the desired state that still had connections: weight 0 until
	// they have none or their deadline passes.
	draining map[vsKey]map[realKey]time.Time
	// phases times the steps of the current sync, for the log; writes counts the objects written.
	phases phaseTimer
	writes writes
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

var _ proxy.Dataplane = (*Dataplane)(nil)

// model is what the kernel holds, as far as the dataplane knows. Set members are not in it: they are
// read at full syncs, and between them the kernel holds what the desired state wanted (see touched).
type model struct {
	vs    map[vsKey]*modelVS
	binds map[netip.Addr]bool
}

type modelVS struct {
	kernelVS
	reals realWeights
}

// realWeights are the real servers of a virtual server with their weights, sorted by key. A slice, not a
// map: virtual servers have few real servers each, and at 10,000 Services a map per virtual server was
// a sixth of the writer's heap.
type realWeights []realWeight

type realWeight struct {
	key    realKey
	weight uint32
}

func (rs realWeights) find(r realKey) (int, bool) {
	return slices.BinarySearchFunc(rs, r, func(w realWeight, r realKey) int { return w.key.compare(r) })
}

// get returns the weight of r, and whether it is there.
func (rs realWeights) get(r realKey) (uint32, bool) {
	if i, ok := rs.find(r); ok {
		return rs[i].weight, true
	}
	return 0, false
}

// weight returns the weight of r, 0 when it is not there.
func (rs realWeights) weight(r realKey) uint32 {
	w, _ := rs.get(r)
	return w
}

// set adds r or changes its weight.
func (rs *realWeights) set(r realKey, weight uint32) {
	i, ok := rs.find(r)
	if ok {
		(*rs)[i].weight = weight
		return
	}
	*rs = slices.Insert(*rs, i, realWeight{r, weight})
}

// del removes r.
func (rs *realWeights) del(r realKey) {
	if i, ok := rs.find(r); ok {
		*rs = slices.Delete(*rs, i, i+1)
	}
}

// realWeightsOf returns the real servers as the kernel reported them.
func realWeightsOf(list []kernelReal) realWeights {
	rs := make(realWeights, len(list))
	for i, r := range list {
		rs[i] = realWeight{r.key, r.weight}
	}
	slices.SortFunc(rs, func(a, b realWeight) int { return a.key.compare(b.key) })
	return slices.CompactFunc(rs, func(a, b realWeight) bool { return a.key == b.key })
}

func newModel() *model {
	return &model{vs: map[vsKey]*modelVS{}, binds: map[netip.Addr]bool{}}
}

// Reconfigure takes a reloaded configuration; the next Apply is full and applies it. A scheduler the
// kernel does not have, or a sysctl or IPVS timeout the kernel refuses, is an error, and the old
// configuration stays.
func (d *Dataplane) Reconfigure(cfg *config.KubeProxyConfiguration) error {
	c, err := ConfigFrom(cfg, d.family)
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
	d.rerender = true
	d.state.Reconfigured()
	return nil
}

// Apply makes the kernel match snap. A full Apply reads the kernel's state and repairs every difference;
// a partial one renders again the Service ports that changed since the last successful Apply and writes only
// what they changed. After any failure the next Apply is full.
func (d *Dataplane) Apply(ctx context.Context, snap *proxy.Snapshot, full bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	d.phases.start()
	before := d.writes.read()
	s := d.state.Begin()
	full = full || s.Full || !s.Last.Node.Equal(&snap.Node)
	var changed []proxy.ServicePortName
	var err error
	if full {
		err = d.syncFull(ctx, snap)
	} else {
		changed = snap.Changes(s.Last)
		err = d.syncPartial(ctx, snap)
	}
	if err != nil {
		klog.V(2).InfoS("Syncing IPVS failed", "ipFamily", d.family, "full", full, "writes", d.writes.read().sub(before).String(),
			"elapsed", time.Since(start), "err", err)
		return err
	}
	d.state.Succeeded(s, snap)
	syncstate.CleanConntrack(d.clean, d.family, snap, full, changed)
	klog.V(2).InfoS("Synced IPVS", "ipFamily", d.family, "full", full, "changed", len(changed),
		"writes", d.writes.read().sub(before).String(),
		"virtualServers", len(d.have.vs), "draining", len(d.draining), "elapsed", time.Since(start),
		"steps", strings.Join(d.phases.steps, " "))
	return nil
}

// render renders every Service port of snap with the dataplane's configuration and addresses.
func (d *Dataplane) render(snap *proxy.Snapshot) *desired { return renderAll(&d.cfg, &d.en, snap) }

// renderAll renders every Service port of snap for cfg on a node whose addresses en knows.
func renderAll(cfg *Config, en *env, snap *proxy.Snapshot) *desired {
	want := newDesired()
	for name, sp := range snap.Services {
		if p := renderPort(cfg, en, &snap.Node, sp); p != nil {
			want.set(name, p, nil)
		}
	}
	return want
}
