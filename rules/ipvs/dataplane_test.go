package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

var (
	nodeV4 = node("192.168.0.10", "10.244.1.0/24")
	nodeV6 = node("fd00::10", "fd00:10:244:1::/64")
)

func webSvc(endpoints ...string) *proxy.ServicePort {
	return svc("default/web", "", v1.ProtocolTCP, "10.96.0.10", 80, nodePort(30080), eps(endpoints...))
}

func dnsSvc(endpoints ...string) *proxy.ServicePort {
	return svc("kube-system/dns", "", v1.ProtocolUDP, "10.96.0.53", 53, eps(endpoints...))
}

// wantState is the kernel state a snapshot should produce: its desired state, as the renderer makes it.
func wantState(t *testing.T, cfg Config, k *fakeKernel, snap *proxy.Snapshot) string {
	t.Helper()
	addrs, _ := k.links.localAddrs(cfg.Family, DummyLink)
	d := &Dataplane{cfg: cfg}
	d.en = newEnv(&d.cfg, &snap.Node, addrs)
	return stateOf(&cfg, d.render(snap)).String()
}

func checkKernel(t *testing.T, what string, cfg Config, k *fakeKernel, snap *proxy.Snapshot) {
	t.Helper()
	if diff := cmp.Diff(wantState(t, cfg, k, snap), fakeState(cfg.Family, k).String()); diff != "" {
		t.Errorf("%s: kernel differs from the desired state (-want +got):\n%s", what, diff)
	}
}

// TestApplyConverges runs sequences of snapshots, full and partial, and checks after each that the fake
// kernel holds exactly the desired state of the snapshot.
func TestApplyConverges(t *testing.T) {
	s1 := snapshot(v4, nodeV4,
		webSvc("10.244.1.5:8080,local", "10.244.2.6:8080"),
		dnsSvc("10.244.2.7:53", "10.244.3.8:53"),
		svc("default/lb", "", v1.ProtocolTCP, "10.96.0.30", 443, nodePort(30443), lbIPs("198.51.100.20"),
			sourceRanges("203.0.113.0/24"), etpLocal(32000), eps("10.244.1.5:8443,local", "10.244.2.6:8443")))
	s2 := derive(s1, nil, webSvc("10.244.2.6:8080", "10.244.2.9:8080"))            // endpoints changed
	s3 := derive(s2, []string{"kube-system/dns"})                                  // Service removed
	s4 := derive(s3, nil, svc("default/ext", "", v1.ProtocolTCP, "10.96.0.40", 80, // Service added
		externalIPs("203.0.113.7"), affinity(600), eps("10.244.2.6:80")))
	s5 := derive(s4, []string{"default/lb"}, webSvc())                                         // no endpoints
	s6 := snapshot(v4, node("192.168.0.11", "10.244.1.0/24"), webSvc("10.244.1.5:8080,local")) // node changed
	steps := []struct {
		name string
		snap *proxy.Snapshot
		full bool
	}{
		{"initial", s1, true}, {"endpoints changed", s2, false}, {"service removed", s3, false},
		{"service added", s4, false}, {"no endpoints and a removal", s5, false}, {"resync", s5, true},
		{"node changed", s6, false},
	}
	for _, perVS := range []bool{false, true} {
		t.Run(fmt.Sprintf("real servers listed per virtual server %v", perVS), func(t *testing.T) {
			cfg := testConfig(v4)
			k := newFakeKernel(t, "192.168.0.10")
			k.ipvs.noAllReals = perVS
			d := newTestDataplane(t, k, cfg, nil)
			for _, s := range steps {
				if s.name == "node changed" {
					k.links.links["eth0"] = map[netip.Addr]bool{netip.MustParseAddr("192.168.0.11"): true}
				}
				apply(t, d, s.snap, s.full)
				checkKernel(t, s.name, cfg, k, s.snap)
				if got, want := k.rules[v4].dump(), rulesDump(t, d, k, s.snap); got != want {
					t.Errorf("%s: iptables differ from the rendered rules (-want +got):\n%s", s.name, cmp.Diff(want, got))
				}
			}
		})
	}
}

// TestResyncWritesNothing: a full sync of a kernel that already matches the desired state writes no virtual or
// real server, set member or address, after full and after partial syncs; a repair counts its writes.
func TestResyncWritesNothing(t *testing.T) {
	s1 := snapshot(v4, nodeV4,
		webSvc("10.244.1.5:8080,local", "10.244.2.6:8080"),
		dnsSvc("10.244.2.7:53", "10.244.3.8:53"),
		svc("default/lb", "", v1.ProtocolTCP, "10.96.0.30", 443, nodePort(30443), lbIPs("198.51.100.20"),
			sourceRanges("203.0.113.0/24"), etpLocal(32000), affinity(600), eps("10.244.1.5:8443,local", "10.244.2.6:8443")))
	s2 := derive(s1, nil, webSvc("10.244.2.6:8080", "10.244.2.9:8080"))
	k := newFakeKernel(t, "192.168.0.10")
	d := newTestDataplane(t, k, testConfig(v4), nil)
	resync := func(step string, snap *proxy.Snapshot) {
		t.Helper()
		before := d.writes.read()
		apply(t, d, snap, true)
		if w := d.writes.read().sub(before); w.total() != 0 {
			t.Errorf("%s: a resync of an unchanged kernel wrote %s", step, w)
		}
	}
	apply(t, d, s1, true)
	if w := d.writes.read(); w.vs == 0 || w.reals == 0 || w.members == 0 || w.addrs == 0 {
		t.Fatalf("the first sync wrote %s, want every kind", w)
	}
	resync("after a full sync", s1)
	apply(t, d, s2, false)
	resync("after a partial sync", s2)

	k.ipvs.removeService(key(protoTCP, "10.96.0.10:80"))
	before := d.writes.read()
	apply(t, d, s2, true)
	if w := d.writes.read().sub(before); w.vs != 1 || w.reals != 2 {
		t.Errorf("repairing a removed virtual server wrote %s, want virtualServers=1 realServers=2", w)
	}
	resync("after the repair", s2)
}

// rulesDump is what the fake iptables should hold after restoring d's rules for snap onto empty tables
// and ensuring the jumps.
func rulesDump(t *testing.T, d *Dataplane, k *fakeKernel, snap *proxy.Snapshot) string {
	t.Helper()
	f := newFakeRules(d.family, k.sets)
	payload := renderRules(&d.cfg, &ruleInputs{nonEmpty: d.want.nonEmpty(), noNodeAccess: d.want.sortedNoNodeAccess(), node: &snap.Node})
	if err := f.restore(context.Background(), payload); err != nil {
		t.Fatalf("restoring the rendered rules: %v", err)
	}
	// The jumps, prepended one by one as iptables -I would.
	for _, j := range jumpRules {
		if _, err := f.ts.Run(append([]string{"-t", j.Table, "-I", j.Chain, "1"}, j.RuleSpec()...)...); err != nil {
			t.Fatal(err)
		}
	}
	return f.dump()
}

// TestPartialTouchesOnlyChanges tampers with the kernel behind the dataplane's back: a partial sync for an
// unrelated change leaves the tampering alone (it did not touch those objects), a full sync repairs all.
func TestPartialTouchesOnlyChanges(t *testing.T) {
	cfg := testConfig(v4)
	k := newFakeKernel(t, "192.168.0.10")
	d := newTestDataplane(t, k, cfg, nil)
	s1 := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080", "10.244.2.7:8080"), dnsSvc("10.244.2.8:53"),
		svc("default/other", "", v1.ProtocolTCP, "10.96.0.20", 80, externalIPs("203.0.113.7"), eps("10.244.3.3:80")))
	apply(t, d, s1, true)

	// Behind our back: the web cluster IP's scheduler, a real server, a set entry, an address, a rule.
	webVS := key(protoTCP, "10.96.0.10:80")
	k.ipvs.vs[webVS].scheduler = "wlc"
	delete(k.ipvs.vs[webVS].reals, rkey("10.244.2.7:8080"))
	k.ipvs.vs[key(protoTCP, "10.96.0.20:80")].reals[rkey("10.244.9.9:80")] = &kernelReal{key: rkey("10.244.9.9:80"), weight: 1}
	delete(k.sets.sets["KUBE-CLUSTER-IP"].entries, ipPortEntry(netip.MustParseAddr("10.96.0.20"), protoTCP, 80))
	delete(k.links.links[DummyLink], netip.MustParseAddr("203.0.113.7"))
	if _, err := k.rules[v4].ts.Run("-t", "nat", "-F", "KUBE-MARK-MASQ"); err != nil {
		t.Fatal(err)
	}
	k.ipvs.vs[key(protoTCP, "10.96.0.99:80")] = &fakeVS{kernelVS: kernelVS{key: key(protoTCP, "10.96.0.99:80"), scheduler: "rr"}, reals: map[realKey]*kernelReal{}}
	tampered := fakeState(v4, k).String()
	tamperedRules := k.rules[v4].dump()

	// A partial sync changing only dns.
	s2 := derive(s1, nil, dnsSvc("10.244.2.8:53", "10.244.2.9:53"))
	apply(t, d, s2, false)
	got := fakeState(v4, k).String()
	wantLines := strings.Replace(tampered, "udp/10.96.0.53:53 rr\n  -> 10.244.2.8:53 weight 1\n",
		"udp/10.96.0.53:53 rr\n  -> 10.244.2.8:53 weight 1\n  -> 10.244.2.9:53 weight 1\n", 1)
	if diff := cmp.Diff(wantLines, got); diff != "" {
		t.Errorf("partial sync touched more than the changed Service (-want +got):\n%s", diff)
	}
	if got := k.rules[v4].dump(); got != tamperedRules {
		t.Errorf("partial sync without rule changes restored the rules:\n%s", cmp.Diff(tamperedRules, got))
	}

	apply(t, d, s2, true)
	checkKernel(t, "after a full sync", cfg, k, s2)
	if got, want := k.rules[v4].dump(), rulesDump(t, d, k, s2); got != want {
		t.Errorf("full sync did not repair the rules (-want +got):\n%s", cmp.Diff(want, got))
	}
}

func TestExcludeCIDRs(t *testing.T) {
	cfg := testConfig(v4)
	cfg.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.100.0/24")}
	k := newFakeKernel(t, "192.168.0.10")
	for _, s := range []string{"10.96.100.1:80", "10.96.200.1:80"} {
		k.ipvs.vs[key(protoTCP, s)] = &fakeVS{kernelVS: kernelVS{key: key(protoTCP, s), scheduler: "rr"}, reals: map[realKey]*kernelReal{}}
	}
	d := newTestDataplane(t, k, cfg, nil)
	apply(t, d, snapshot(v4, nodeV4, svc("default/in-excluded", "", v1.ProtocolTCP, "10.96.100.2", 80, eps("10.244.2.6:80"))), true)
	if _, ok := k.ipvs.vs[key(protoTCP, "10.96.100.1:80")]; !ok {
		t.Error("a virtual server in excludeCIDRs was deleted")
	}
	if _, ok := k.ipvs.vs[key(protoTCP, "10.96.200.1:80")]; ok {
		t.Error("a stale virtual server outside excludeCIDRs was kept")
	}
	if _, ok := k.ipvs.vs[key(protoTCP, "10.96.100.2:80")]; !ok {
		t.Error("a Service inside excludeCIDRs got no virtual server (excludeCIDRs only protects from deletion)")
	}
}

// TestDualStack runs both families' dataplanes on one kernel: neither deletes the other's objects.
func TestDualStack(t *testing.T) {
	k := newFakeKernel(t, "192.168.0.10", "fd00::10")
	d4 := newTestDataplane(t, k, testConfig(v4), nil)
	d6 := newTestDataplane(t, k, testConfig(v6), nil)
	s4 := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080"))
	s6 := snapshot(v6, nodeV6, svc("default/web", "", v1.ProtocolTCP, "fd00:96::10", 80, nodePort(30080),
		eps("[fd00:10:244:2::6]:8080")))
	for i := 0; i < 2; i++ {
		apply(t, d4, s4, true)
		apply(t, d6, s6, true)
	}
	checkKernel(t, "IPv4", testConfig(v4), k, s4)
	checkKernel(t, "IPv6", testConfig(v6), k, s6)
	if _, ok := k.sets.sets["KUBE-6-CLUSTER-IP"]; !ok {
		t.Error("no KUBE-6-CLUSTER-IP set")
	}
	if !strings.Contains(k.rules[v6].dump(), "KUBE-6-CLUSTER-IP") || strings.Contains(k.rules[v4].dump(), "KUBE-6-") {
		t.Error("each family's rules must match its own sets")
	}
}

// TestGracefulTermination follows a TCP real server from removal to deletion, and one that comes back.
func TestGracefulTermination(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := testConfig(v4)
	k := newFakeKernel(t, "192.168.0.10")
	d := newTestDataplane(t, k, cfg, clock)
	vs := key(protoTCP, "10.96.0.10:80")
	a, b := rkey("10.244.2.6:8080"), rkey("10.244.2.7:8080")
	s1 := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080", "10.244.2.7:8080", "10.244.2.8:8080"))
	apply(t, d, s1, true)
	k.ipvs.conns(vs, a, 1, 0)
	k.ipvs.conns(vs, b, 0, 2)

	weights := func() map[realKey]uint32 {
		out := map[realKey]uint32{}
		for r, x := range k.ipvs.vs[vs].reals {
			out[r] = x.weight
		}
		return out
	}
	check := func(what string, want map[realKey]uint32, wantDraining int) {
		t.Helper()
		if diff := cmp.Diff(want, weights()); diff != "" {
			t.Errorf("%s: real servers of %s (-want +got):\n%s", what, vs, diff)
		}
		if got := len(d.Draining()); got != wantDraining {
			t.Errorf("%s: %d draining, want %d (%v)", what, got, wantDraining, d.Draining())
		}
	}

	// All three leave: a and b have connections and drain, c has none and goes at once.
	s2 := derive(s1, nil, webSvc("10.244.2.9:8080"))
	apply(t, d, s2, false)
	d9 := rkey("10.244.2.9:8080")
	check("removed", map[realKey]uint32{a: 0, b: 0, d9: 1}, 2)
	// The same on a full sync changes nothing.
	apply(t, d, s2, true)
	check("resync", map[realKey]uint32{a: 0, b: 0, d9: 1}, 2)

	// b's connections end: the next drain deletes it; a keeps its connection.
	k.ipvs.conns(vs, b, 0, 0)
	clock.t = clock.t.Add(time.Minute)
	d.drain()
	check("b drained", map[realKey]uint32{a: 0, d9: 1}, 1)

	// a comes back before its deadline: weight 1 again, no longer draining.
	s3 := derive(s2, nil, webSvc("10.244.2.6:8080", "10.244.2.9:8080"))
	apply(t, d, s3, false)
	check("a restored", map[realKey]uint32{a: 1, d9: 1}, 0)

	// a leaves again and keeps its connection past the deadline: deleted anyway.
	apply(t, d, s2, false)
	check("a removed again", map[realKey]uint32{a: 0, d9: 1}, 1)
	clock.t = clock.t.Add(DefaultDrainTimeout - time.Second)
	d.drain()
	check("before the deadline", map[realKey]uint32{a: 0, d9: 1}, 1)
	clock.t = clock.t.Add(2 * time.Second)
	d.drain()
	check("after the deadline", map[realKey]uint32{d9: 1}, 0)

	// A restart forgets the draining list: a weight-0 real server with connections is drained again.
	k.ipvs.vs[vs].reals[a] = &kernelReal{key: a, weight: 0, active: 3}
	d2 := newTestDataplane(t, k, cfg, clock)
	apply(t, d2, s2, true)
	if got := d2.Draining(); len(got) != 1 {
		t.Errorf("after a restart: draining %v, want %s", got, a)
	}

	// UDP real servers go at once, connections or not.
	dns := key(protoUDP, "10.96.0.53:53")
	s4 := snapshot(v4, nodeV4, dnsSvc("10.244.2.7:53", "10.244.2.8:53"))
	apply(t, d2, s4, true)
	k.ipvs.conns(dns, rkey("10.244.2.7:53"), 5, 5)
	apply(t, d2, derive(s4, nil, dnsSvc("10.244.2.8:53")), false)
	if _, ok := k.ipvs.vs[dns].reals[rkey("10.244.2.7:53")]; ok {
		t.Error("a removed UDP real server was kept")
	}
	// Removing the Service removes its virtual server, draining or not.
	apply(t, d2, derive(s4, []string{"kube-system/dns"}), false)
	if _, ok := k.ipvs.vs[dns]; ok {
		t.Error("the virtual server of a removed Service was kept")
	}
}

// TestFailureForcesFull injects a kernel error: Apply fails, and the next Apply (asked to be partial) is
// full and repairs what happened meanwhile.
func TestFailureForcesFull(t *testing.T) {
	cfg := testConfig(v4)
	k := newFakeKernel(t, "192.168.0.10")
	d := newTestDataplane(t, k, cfg, nil)
	s1 := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080"), dnsSvc("10.244.2.7:53"))
	apply(t, d, s1, true)

	boom := errors.New("netlink: injected failure")
	k.ipvs.fail = func(op string, vk vsKey) error {
		if op == "createReal" {
			return boom
		}
		return nil
	}
	s2 := derive(s1, nil, webSvc("10.244.2.6:8080", "10.244.2.9:8080"))
	if err := d.Apply(context.Background(), s2, false); !errors.Is(err, boom) {
		t.Fatalf("Apply = %v, want the injected error", err)
	}
	k.ipvs.fail = nil
	delete(k.ipvs.vs, key(protoUDP, "10.96.0.53:53")) // meanwhile, behind our back
	apply(t, d, s2, false)
	checkKernel(t, "after the failure", cfg, k, s2)

	k.rules[v4].fail = errors.New("iptables-restore: line 3 failed")
	if err := d.Apply(context.Background(), s2, true); err == nil {
		t.Fatal("Apply succeeded although iptables-restore failed")
	}
	k.rules[v4].fail = nil
	apply(t, d, s2, false)
	if got, want := k.rules[v4].dump(), rulesDump(t, d, k, s2); got != want {
		t.Errorf("rules not restored after a failure:\n%s", cmp.Diff(want, got))
	}
}

// TestReconfigure changes the scheduler and strictARP on a live dataplane.
func TestReconfigure(t *testing.T) {
	k := newFakeKernel(t, "192.168.0.10")
	kp := config.Default()
	kp.Mode = config.ModeIPVS
	kp.ClusterCIDR = "10.244.0.0/16"
	cfg, err := ConfigFrom(kp, v4)
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDataplane(t, k, cfg, nil)
	s := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080"))
	apply(t, d, s, true)
	if k.sysctl.get("net/ipv4/conf/all/arp_ignore") != "0" {
		t.Error("arp_ignore set without strictARP")
	}
	kp.IPVS.Scheduler = "sh"
	kp.IPVS.StrictARP = true
	kp.IPVS.TCPTimeout.Duration = 900 * time.Second
	if err := d.Reconfigure(kp); err != nil {
		t.Fatal(err)
	}
	apply(t, d, s, false)
	if got := k.ipvs.vs[key(protoTCP, "10.96.0.10:80")].scheduler; got != "sh" {
		t.Errorf("scheduler after reload = %q, want sh", got)
	}
	if k.sysctl.get("net/ipv4/conf/all/arp_ignore") != "1" || k.sysctl.get("net/ipv4/conf/all/arp_announce") != "2" {
		t.Error("strictARP sysctls not set on reload")
	}
	if k.ipvs.timeouts != [3]uint32{900, 0, 0} {
		t.Errorf("timeouts = %v", k.ipvs.timeouts)
	}
	kp.IPVS.Scheduler = "bogus"
	if err := d.Reconfigure(kp); err == nil {
		t.Error("an unknown scheduler was accepted")
	}
	// "nope" passes validation in this test but the fake kernel has no such module.
	Schedulers = append(Schedulers, "nope")
	defer func() { Schedulers = Schedulers[:len(Schedulers)-1] }()
	kp.IPVS.Scheduler = "nope"
	if err := d.Reconfigure(kp); err == nil || !strings.Contains(err.Error(), "ip_vs_nope") {
		t.Errorf("a scheduler the kernel lacks: err = %v, want one naming ip_vs_nope", err)
	}
	apply(t, d, s, true)
	if got := k.ipvs.vs[key(protoTCP, "10.96.0.10:80")].scheduler; got != "sh" {
		t.Errorf("scheduler after a refused reload = %q, want sh kept", got)
	}
	// Timeouts the kernel refuses: the whole reload is refused, the scheduler included.
	kp.IPVS.Scheduler = "lc"
	kp.IPVS.TCPTimeout.Duration = 600 * time.Second
	k.ipvs.failTimeouts = errors.New("invalid argument")
	if err := d.Reconfigure(kp); err == nil || !strings.Contains(err.Error(), "IPVS timeouts") {
		t.Errorf("refused timeouts: err = %v, want one about the IPVS timeouts", err)
	}
	k.ipvs.failTimeouts = nil
	apply(t, d, s, true)
	if got := k.ipvs.vs[key(protoTCP, "10.96.0.10:80")].scheduler; got != "sh" {
		t.Errorf("scheduler after a reload refused for its timeouts = %q, want sh kept", got)
	}
}

func TestSysctls(t *testing.T) {
	for _, tt := range []struct {
		name    string
		kernel  [2]int
		strict  bool
		changed map[string]string
	}{
		{"6.1", [2]int{6, 1}, false, map[string]string{"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
			"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1"}},
		{"5.4 with strictARP", [2]int{5, 4}, true, map[string]string{"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
			"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1", "net/ipv4/vs/conn_reuse_mode": "0",
			"net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel(t)
			kn := k.kernel(v4)
			kn.kernelVersion = tt.kernel
			cfg := testConfig(v4)
			cfg.StrictARP = tt.strict
			if _, err := newDataplane(context.Background(), cfg, kn, nil, nil, WithDrainInterval(0)); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for n, was := range fakeSysctls {
				if v := k.sysctl.get(n); v != was {
					got[n] = v
				}
			}
			if diff := cmp.Diff(tt.changed, got); diff != "" {
				t.Errorf("sysctls changed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigFrom(t *testing.T) {
	kp := config.Default()
	kp.ClusterCIDR = "10.244.0.0/16,fd00:10:244::/56"
	kp.IPVS.ExcludeCIDRs = []string{"10.96.100.0/24", "fd00:100::/64"}
	kp.NodePortAddresses = []string{"primary", "192.168.0.0/16"}
	c4, err := ConfigFrom(kp, v4)
	if err != nil {
		t.Fatal(err)
	}
	c6, err := ConfigFrom(kp, v6)
	if err != nil {
		t.Fatal(err)
	}
	if c4.Scheduler != "rr" || c4.MasqueradeBit != 14 || c4.mark() != "0x00004000" {
		t.Errorf("defaults: %+v", c4)
	}
	for _, c := range []Config{c4, c6} {
		want, err := proxy.SettingsFor(kp, c.Family)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.Settings, want) {
			t.Errorf("%s settings %+v, want proxy.SettingsFor's %+v", c.Family, c.Settings, want)
		}
	}
	if len(c4.ExcludeCIDRs) != 1 || len(c6.ExcludeCIDRs) != 1 {
		t.Errorf("exclude CIDRs per family: %v %v", c4.ExcludeCIDRs, c6.ExcludeCIDRs)
	}
	kp.IPVS.Scheduler = "xx"
	if _, err := ConfigFrom(kp, v4); err == nil || !strings.Contains(err.Error(), "ipvs.scheduler") {
		t.Errorf("unknown scheduler: err = %v", err)
	}
}

// TestConflictHandover: two Services claim one external IP and port; the first by name wins, and when it
// goes the other takes over, also in a partial sync.
func TestConflictHandover(t *testing.T) {
	cfg := testConfig(v4)
	k := newFakeKernel(t, "192.168.0.10")
	d := newTestDataplane(t, k, cfg, nil)
	a := svc("default/a", "", v1.ProtocolTCP, "10.96.0.21", 80, externalIPs("203.0.113.7"), eps("10.244.2.1:80"))
	b := svc("default/b", "", v1.ProtocolTCP, "10.96.0.22", 80, externalIPs("203.0.113.7"), eps("10.244.2.2:80"))
	s1 := snapshot(v4, nodeV4, a, b)
	apply(t, d, s1, true)
	ext := key(protoTCP, "203.0.113.7:80")
	reals := func() []string {
		var out []string
		for r := range k.ipvs.vs[ext].reals {
			out = append(out, r.String())
		}
		return out
	}
	if got := reals(); !cmp.Equal(got, []string{"10.244.2.1:80"}) {
		t.Errorf("with both: %v, want default/a's endpoint", got)
	}
	s2 := derive(s1, []string{"default/a"})
	apply(t, d, s2, false)
	if got := reals(); !cmp.Equal(got, []string{"10.244.2.2:80"}) {
		t.Errorf("after default/a left: %v, want default/b's endpoint", got)
	}
	if !k.links.links[DummyLink][netip.MustParseAddr("203.0.113.7")] {
		t.Error("the shared external IP was unbound while default/b still uses it")
	}
	checkKernel(t, "after the handover", cfg, k, s2)
}

// TestWatchSyncsWhenTheNodesAddressesChange: an address added to a link of the node asks for a full sync
// at once (only full syncs read the addresses), so NodePorts answer on it without waiting for the
// periodic sync; notifications that change nothing rendering uses (an address on kube-ipvs0, the same
// addresses) ask for nothing; after a failed subscription the addresses are compared again.
func TestWatchSyncsWhenTheNodesAddressesChange(t *testing.T) {
	k := newFakeKernel(t, "192.168.0.10")
	k.links.events, k.links.handled = make(chan error), make(chan struct{}, 1)
	d := newTestDataplane(t, k, testConfig(v4), nil)
	apply(t, d, snapshot(v4, nodeV4, webSvc("10.244.1.5:8080")), true)
	watchRetry = 10 * time.Millisecond
	t.Cleanup(func() { watchRetry = 5 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	syncs := make(chan bool, 10)
	done := make(chan struct{})
	go func() { d.Watch(ctx, time.Hour, func(full bool) { syncs <- full }); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	notify := func() { k.links.events <- nil; <-k.links.handled }
	none := func(what string) {
		t.Helper()
		select {
		case full := <-syncs:
			t.Errorf("%s: a sync (full=%v) was asked for", what, full)
		case <-time.After(50 * time.Millisecond):
		}
	}

	notify()
	none("a notification without a change")
	k.links.links[DummyLink][netip.MustParseAddr("10.96.0.99")] = true
	notify()
	none("an address added to kube-ipvs0")

	k.links.links["eth0"][netip.MustParseAddr("192.168.0.11")] = true
	notify()
	select {
	case full := <-syncs:
		if !full {
			t.Error("a new node address asked for a partial sync; only a full one reads the addresses")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a new node address asked for no sync")
	}
	apply(t, d, snapshot(v4, nodeV4, webSvc("10.244.1.5:8080")), true)
	if !d.en.isLocal(netip.MustParseAddr("192.168.0.11")) {
		t.Fatal("the full sync did not take the new address")
	}

	delete(k.links.links["eth0"], netip.MustParseAddr("192.168.0.11"))
	k.links.events <- errors.New("netlink: no buffer space")
	select {
	case <-syncs:
	case <-time.After(5 * time.Second):
		t.Fatal("after a failed subscription, a change made meanwhile asked for no sync")
	}
}

// TestJumpsPutBack: a full sync puts back the jumps someone removed, at the top of their chains as
// prepending them one by one would, without duplicating those still there, also when the tables cannot be
// read before the restore.
func TestJumpsPutBack(t *testing.T) {
	cfg := testConfig(v4)
	k := newFakeKernel(t, "192.168.0.10")
	k.rules[v4].failSaves = 1 // as on a node whose nat table does not exist yet
	d := newTestDataplane(t, k, cfg, nil)
	s := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080"))
	apply(t, d, s, true)
	if got, want := k.rules[v4].dump(), rulesDump(t, d, k, s); got != want {
		t.Fatalf("after the first sync (-want +got):\n%s", cmp.Diff(want, got))
	}
	removed := []xtables.JumpRule{jumpRules[0], jumpRules[4]}
	for _, j := range removed {
		if _, err := k.rules[v4].ts.Run(append([]string{"-t", j.Table, "-D", j.Chain}, j.RuleSpec()...)...); err != nil {
			t.Fatal(err)
		}
	}
	// What prepending the missing ones one by one (iptables -C, then -I 1) makes of it.
	want := k.rules[v4].ts.Clone()
	for _, j := range removed {
		if _, err := want.Run(append([]string{"-t", j.Table, "-I", j.Chain, "1"}, j.RuleSpec()...)...); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, d, s, true)
	if got := k.rules[v4].dump(); got != want.SaveAll() {
		t.Errorf("jumps not put back as prepending them would (-want +got):\n%s", cmp.Diff(want.SaveAll(), got))
	}
}

// A set member that one Service port stops wanting and another starts wanting in the same partial sync
// stays in the kernel, whichever port is rendered again first.
func TestPartialHandsOverSetMembers(t *testing.T) {
	for _, newName := range []string{"default/a-new", "default/z-new"} {
		t.Run(newName, func(t *testing.T) {
			cfg := testConfig(v4)
			k := newFakeKernel(t, "192.168.0.10")
			d := newTestDataplane(t, k, cfg, nil)
			s1 := snapshot(v4, nodeV4, svc("default/m-old", "", v1.ProtocolTCP, "10.96.0.20", 80,
				externalIPs("203.0.113.7"), eps("10.244.3.3:80")))
			apply(t, d, s1, true)
			s2 := derive(s1, []string{"default/m-old"}, svc(newName, "", v1.ProtocolTCP, "10.96.0.21", 81,
				externalIPs("203.0.113.7"), eps("10.244.3.4:80")))
			apply(t, d, s2, false)
			checkKernel(t, "after the partial sync", cfg, k, s2)
		})
	}
}

// Full syncs render again only the ports that changed since the desired state was rendered. The desired
// state kept that way is the one rendered from scratch, also after a failed sync whose snapshot was
// rendered but never applied: here
// web's port goes back to the very object it was before the failure.
func TestFullSyncKeepsTheDesiredStateOfUnchangedPorts(t *testing.T) {
	cfg := testConfig(v4)
	k := newFakeKernel(t, "192.168.0.10")
	d := newTestDataplane(t, k, cfg, nil)
	s1 := snapshot(v4, nodeV4, webSvc("10.244.2.6:8080"), dnsSvc("10.244.2.7:53"))
	apply(t, d, s1, true)
	var web proxy.ServicePortName
	for name := range s1.Services {
		if name.Name == "web" {
			web = name
		}
	}
	s2 := derive(s1, nil, webSvc("10.244.2.6:8080", "10.244.2.9:8080"))
	k.rules[v4].fail = errors.New("iptables-restore: injected failure")
	if err := d.Apply(context.Background(), s2, true); err == nil {
		t.Fatal("Apply succeeded although iptables-restore failed")
	}
	k.rules[v4].fail = nil
	s3 := derive(s2, []string{"kube-system/dns"}, s1.Services[web])
	apply(t, d, s3, true)
	checkKernel(t, "after the full sync", cfg, k, s3)
	s4 := derive(s3, nil, dnsSvc("10.244.2.8:53"))
	apply(t, d, s4, false)
	apply(t, d, s4, true)
	checkKernel(t, "after a partial and a full sync", cfg, k, s4)
	if diff := cmp.Diff(stateOf(&cfg, d.render(s4)).String(), stateOf(&cfg, d.want).String()); diff != "" {
		t.Errorf("the kept desired state differs from a fresh one (-fresh +kept):\n%s", diff)
	}
}
