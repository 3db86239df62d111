package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules/sysctl"
)

const testNode = proxytest.NodeName

var (
	v4 = v1.IPv4Protocol
	v6 = v1.IPv6Protocol
)

// The builders of hand-made snapshots, shared with the iptables tests.
var (
	svc          = proxytest.Port
	eps          = proxytest.Endpoints
	nodePort     = proxytest.NodePort
	externalIPs  = proxytest.ExternalIPs
	lbIPs        = proxytest.LoadBalancerIPs
	sourceRanges = proxytest.SourceRanges
	affinity     = proxytest.Affinity
	etpLocal     = proxytest.ExternalLocal
	itpLocal     = proxytest.InternalLocal
	node         = proxytest.Node
	snapshot     = proxytest.Snapshot
)

// derive returns a snapshot like base with ports replaced or added and the ports of the named Services
// ("ns/name" or "ns/name:port") removed.
func derive(base *proxy.Snapshot, remove []string, ports ...*proxy.ServicePort) *proxy.Snapshot {
	var names []proxy.ServicePortName
	for _, r := range remove {
		for k := range base.Services {
			if k.String() == r {
				names = append(names, k)
			}
		}
	}
	return proxytest.Derive(base, names, ports...)
}

func testConfig(family v1.IPFamily) Config {
	cidr := netip.MustParsePrefix("10.244.0.0/16")
	if family == v6 {
		cidr = netip.MustParsePrefix("fd00:10:244::/48")
	}
	return Config{Scheduler: "rr", Settings: proxy.Settings{Family: family, MasqueradeBit: config.DefaultMasqueradeBit,
		LocalDetector: proxy.LocalDetector{Mode: config.LocalModeClusterCIDR, CIDR: cidr}}}
}

// state is a readable dump of kernel state of one family: virtual servers with real servers, addresses on
// kube-ipvs0, non-empty sets. Desired states and fake kernels print the same way so they can be compared.
type state struct {
	vs    []string
	binds []string
	sets  map[string][]string
}

func (s *state) String() string {
	var b strings.Builder
	b.WriteString("# virtual servers\n")
	for _, l := range s.vs {
		b.WriteString(l + "\n")
	}
	b.WriteString("# " + DummyLink + "\n")
	for _, l := range s.binds {
		b.WriteString(l + "\n")
	}
	names := make([]string, 0, len(s.sets))
	for n := range s.sets {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		b.WriteString("# ipset " + n + "\n")
		for _, l := range s.sets[n] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func vsLine(k vsKey, scheduler string, flags, timeout uint32) string {
	s := fmt.Sprintf("%s %s", k, scheduler)
	if flags&flagPersistent != 0 {
		s += fmt.Sprintf(" persistent %d", timeout)
	}
	if f := flags &^ flagPersistent; f != 0 {
		s += fmt.Sprintf(" flags %#x", f)
	}
	return s
}

// stateOf dumps what a desired state wants.
func stateOf(cfg *Config, d *desired) *state {
	s := &state{sets: map[string][]string{}}
	keys := make([]vsKey, 0, len(d.claims))
	for k := range d.claims {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, vsKey.compare)
	for _, k := range keys {
		v := d.vs(k)
		s.vs = append(s.vs, vsLine(k, v.scheduler, v.flags, v.timeout))
		for _, r := range v.reals {
			s.vs = append(s.vs, "  -> "+r.String()+" weight 1")
		}
	}
	for a := range d.binds {
		s.binds = append(s.binds, a.String())
	}
	slices.Sort(s.binds)
	for id := setID(0); id < numSets; id++ {
		var es []entry
		for e := range d.sets[id] {
			es = append(es, e)
		}
		if len(es) == 0 {
			continue
		}
		slices.SortFunc(es, entry.compare)
		for _, e := range es {
			s.sets[setName(id, cfg.Family)] = append(s.sets[setName(id, cfg.Family)], e.String())
		}
	}
	return s
}

// fakeState dumps what a fake kernel holds for one family (draining real servers show their weight).
func fakeState(family v1.IPFamily, k *fakeKernel) *state {
	s := &state{sets: map[string][]string{}}
	list, _ := k.ipvs.services()
	for _, v := range list {
		if familyOf(v.key.Addr()) != family {
			continue
		}
		s.vs = append(s.vs, vsLine(v.key, v.scheduler, v.flags, v.timeout))
		rs, _ := k.ipvs.reals(v.key)
		for _, r := range rs {
			s.vs = append(s.vs, fmt.Sprintf("  -> %s weight %d", r.key, r.weight))
		}
	}
	addrs, _ := k.links.addrs(DummyLink, family)
	for _, a := range addrs {
		s.binds = append(s.binds, a.String())
	}
	for name := range k.sets.sets {
		if strings.HasPrefix(name, "KUBE-6-") != (family == v6) {
			continue
		}
		es, _ := k.sets.listSet(name)
		for _, e := range es {
			s.sets[name] = append(s.sets[name], e.String())
		}
	}
	return s
}

// fakeKernel bundles the fakes; the IPVS table and links are shared between families, sets are named
// per family, iptables and sysctls are per family (ip6tables) or shared (sysctls).
type fakeKernel struct {
	ipvs   *fakeIPVS
	sets   *fakeSets
	links  *fakeLinks
	rules  map[v1.IPFamily]*fakeRules
	sysctl fakeSysctl
}

func newFakeKernel(t testing.TB, eth0 ...string) *fakeKernel {
	sets := newFakeSets()
	return &fakeKernel{ipvs: newFakeIPVS(), sets: sets, links: newFakeLinks(eth0...),
		rules: map[v1.IPFamily]*fakeRules{v4: newFakeRules(v4, sets), v6: newFakeRules(v6, sets)}, sysctl: newFakeSysctl(t)}
}

func (k *fakeKernel) kernel(family v1.IPFamily) kernel {
	return kernel{ipvs: k.ipvs, sets: k.sets, links: k.links, rules: k.rules[family], sysctl: sysctl.At(k.sysctl.root), kernelVersion: [2]int{6, 1}}
}

// fakeClock is a settable clock for drain deadlines.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// newTestDataplane returns a dataplane on a fake kernel with no drain goroutine (tests call drain).
func newTestDataplane(t testing.TB, k *fakeKernel, cfg Config, clock *fakeClock) *Dataplane {
	t.Helper()
	opts := []Option{WithDrainInterval(0)}
	if clock != nil {
		opts = append(opts, func(o *options) { o.now = clock.now })
	}
	d, err := newDataplane(context.Background(), cfg, k.kernel(cfg.Family), nil, nil, opts...)
	if err != nil {
		t.Fatalf("newDataplane: %v", err)
	}
	return d
}

func apply(t *testing.T, d *Dataplane, snap *proxy.Snapshot, full bool) {
	t.Helper()
	if err := d.Apply(context.Background(), snap, full); err != nil {
		t.Fatalf("Apply(full=%v): %v", full, err)
	}
}

func key(proto protocol, addrPort string) vsKey {
	ap := netip.MustParseAddrPort(addrPort)
	return newVSKey(ap.Addr(), ap.Port(), proto)
}

func rkey(addrPort string) realKey {
	ap := netip.MustParseAddrPort(addrPort)
	return newRealKey(ap.Addr(), ap.Port())
}

func ptr[T any](v T) *T { return &v }
