package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
)

var generation atomic.Uint64

const testNode = "node-a"

var (
	v4 = v1.IPv4Protocol
	v6 = v1.IPv6Protocol
)

// svc builds a Service port; opts adjust it before endpoints are selected by snapshot.
func svc(nsName, portName string, proto v1.Protocol, clusterIP string, port int32, opts ...func(*proxy.ServicePort)) *proxy.ServicePort {
	ns, name, _ := strings.Cut(nsName, "/")
	sp := &proxy.ServicePort{
		Name:      proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: portName, Protocol: proto},
		ClusterIP: netip.MustParseAddr(clusterIP),
		Port:      port,
		Protocol:  proto,
	}
	for _, o := range opts {
		o(sp)
	}
	return sp
}

// eps adds endpoints "ip:port[,flag...]" with flags local, notready, terminating, notserving.
func eps(list ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range list {
			parts := strings.Split(s, ",")
			ap := netip.MustParseAddrPort(parts[0])
			e := proxy.NewEndpoint(ap.Addr(), int32(ap.Port()))
			e.Ready, e.Serving, e.NodeName = true, true, "node-b"
			for _, f := range parts[1:] {
				switch f {
				case "local":
					e.IsLocal, e.NodeName = true, testNode
				case "notready":
					e.Ready = false
				case "terminating":
					e.Terminating = true
				case "notserving":
					e.Serving = false
				default:
					panic("unknown endpoint flag " + f)
				}
			}
			sp.Endpoints = append(sp.Endpoints, e)
		}
		slices.SortFunc(sp.Endpoints, func(a, b proxy.Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
	}
}

func nodePort(n int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.NodePort = n }
}

func externalIPs(ips ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(s))
		}
	}
}

func lbIPs(ips ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(s))
		}
	}
}

func sourceRanges(cidrs ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range cidrs {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

func affinity(seconds int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.StickyMaxAgeSeconds = seconds }
}

func etpLocal(hc int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, hc }
}

func itpLocal(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true }

func node(ips ...string) proxy.Node {
	n := proxy.Node{Name: testNode, Known: true}
	for _, s := range ips {
		if strings.Contains(s, "/") {
			n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(s))
		} else {
			n.IPs = append(n.IPs, netip.MustParseAddr(s))
		}
	}
	return n
}

// snapshot builds a snapshot, selecting endpoints as proxy/ does.
func snapshot(family v1.IPFamily, n proxy.Node, ports ...*proxy.ServicePort) *proxy.Snapshot {
	s := &proxy.Snapshot{Family: family, Generation: generation.Add(1), Node: n, Services: map[proxy.ServicePortName]*proxy.ServicePort{}}
	for _, sp := range ports {
		sel := proxy.SelectEndpoints(sp, sp.Endpoints, n.Name, n.Zone)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = sel.Cluster, sel.Local, sel.HasAny
		s.Services[sp.Name] = sp
	}
	return s
}

// derive returns a snapshot like base with ports replaced or added and names removed.
func derive(base *proxy.Snapshot, remove []string, ports ...*proxy.ServicePort) *proxy.Snapshot {
	s := &proxy.Snapshot{Family: base.Family, Generation: generation.Add(1), Node: base.Node, Services: map[proxy.ServicePortName]*proxy.ServicePort{}}
	for k, v := range base.Services {
		s.Services[k] = v
	}
	for _, r := range remove {
		for k := range s.Services {
			if k.String() == r {
				delete(s.Services, k)
			}
		}
	}
	for _, sp := range ports {
		sel := proxy.SelectEndpoints(sp, sp.Endpoints, s.Node.Name, s.Node.Zone)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = sel.Cluster, sel.Local, sel.HasAny
		s.Services[sp.Name] = sp
	}
	return s
}

func testConfig(family v1.IPFamily) Config {
	c := Config{Family: family, Scheduler: "rr", MasqueradeBit: 14, DetectLocal: detectClusterCIDR,
		DetectLocalCIDR: netip.MustParsePrefix("10.244.0.0/16")}
	if family == v6 {
		c.DetectLocalCIDR = netip.MustParsePrefix("fd00:10:244::/48")
	}
	return c
}

// state is a readable dump of kernel state of one family: virtual servers with real servers, addresses on
// kube-ipvs0, non-empty sets. Plans and fake kernels print the same way so they can be compared.
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

// planState dumps what a plan wants.
func planState(cfg *Config, d *desired) *state {
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
		if familyOf(v.key.addr) != family {
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

func newFakeKernel(eth0 ...string) *fakeKernel {
	return &fakeKernel{ipvs: newFakeIPVS(), sets: newFakeSets(), links: newFakeLinks(eth0...),
		rules: map[v1.IPFamily]*fakeRules{v4: newFakeRules(), v6: newFakeRules()}, sysctl: newFakeSysctl()}
}

func (k *fakeKernel) kernel(family v1.IPFamily) kernel {
	return kernel{ipvs: k.ipvs, sets: k.sets, links: k.links, rules: k.rules[family], sysctl: k.sysctl, kernelVersion: [2]int{6, 1}}
}

// fakeClock is a settable clock for drain deadlines.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// newTestDataplane returns a dataplane on a fake kernel with no drain goroutine (tests call drain).
func newTestDataplane(t *testing.T, k *fakeKernel, cfg Config, clock *fakeClock) *Dataplane {
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
	return vsKey{ap.Addr(), ap.Port(), proto}
}

func rkey(addrPort string) realKey {
	ap := netip.MustParseAddrPort(addrPort)
	return realKey{ap.Addr(), ap.Port()}
}
