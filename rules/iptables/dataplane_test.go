package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/sysctl"
)

// fakeKernel is iptables backed by iptrace.Tables, with the node's nfacct subsystem: restores and
// single-rule commands change its state the way the kernel would, and it refuses what the kernel refuses
// (a rule naming an nfacct counter that was not created, too). failRestore makes the next restores fail
// before touching anything, like a missing lock or a rejected payload.
type fakeKernel struct {
	ts          *iptrace.Tables
	failRestore error
	failAfter   int   // with failRestore: this many restores still succeed first
	failCheck   error // RuleExists fails, as `iptables -C` may while someone else rewrites the table
	payloads    []string
	// counters are the nfacct counters created; failCounter makes creating the one of that name fail.
	counters    []string
	failCounter string
	// onRestore, when set, runs at the start of every restore (a reload arriving mid-sync, say).
	onRestore func()
}

func newFakeKernel() *fakeKernel {
	f := &fakeKernel{ts: iptrace.New(false)}
	f.ts.SetCounters() // none exists yet
	return f
}

// Ensure creates an nfacct counter, as nfacct.Client does.
func (f *fakeKernel) Ensure(name string) error {
	if name == f.failCounter {
		return fmt.Errorf("creating nfacct counter %q: operation not permitted", name)
	}
	if !slices.Contains(f.counters, name) {
		f.counters = append(f.counters, name)
		f.ts.SetCounters(f.counters...)
	}
	return nil
}

func (f *fakeKernel) Restore(_ context.Context, payload []byte) error {
	if f.onRestore != nil {
		f.onRestore()
	}
	if f.failRestore != nil {
		if f.failAfter == 0 {
			return f.failRestore
		}
		f.failAfter--
	}
	f.payloads = append(f.payloads, string(payload))
	return f.ts.Restore(payload, iptrace.RestoreOptions{NoFlush: true})
}

func (f *fakeKernel) ListChains(_ context.Context, table string) ([]string, error) {
	return f.ts.Chains(table), nil
}

func (f *fakeKernel) EnsureChain(table, chain string) error {
	if ok, _ := f.ChainExists(table, chain); ok {
		return nil
	}
	_, err := f.ts.Run("-t", table, "-N", chain)
	return err
}

func (f *fakeKernel) EnsureRule(prepend bool, table, chain string, rule ...string) (bool, error) {
	if _, err := f.ts.Run(append([]string{"-t", table, "-C", chain}, rule...)...); err == nil {
		return false, nil
	}
	op := []string{"-A", chain}
	if prepend {
		op = []string{"-I", chain, "1"}
	}
	_, err := f.ts.Run(append(append([]string{"-t", table}, op...), rule...)...)
	return err == nil, err
}

func (f *fakeKernel) ChainExists(table, chain string) (bool, error) {
	return slices.Contains(f.ts.Chains(table), chain), nil
}

func (f *fakeKernel) RuleExists(table, chain string, rule ...string) (bool, error) {
	if f.failCheck != nil {
		return false, f.failCheck
	}
	_, err := f.ts.Run(append([]string{"-t", table, "-C", chain}, rule...)...)
	return err == nil, nil
}

func (f *fakeKernel) DeleteRule(table, chain string, rule ...string) error {
	if ok, _ := f.RuleExists(table, chain, rule...); !ok {
		return nil
	}
	_, err := f.ts.Run(append([]string{"-t", table, "-D", chain}, rule...)...)
	return err
}

// world builds snapshots through the real Tracker, as the daemon does.
type world struct {
	t       *testing.T
	tracker *proxy.Tracker
}

func newWorld(t *testing.T) *world {
	return &world{t: t, tracker: proxy.NewTracker(proxy.TrackerOptions{NodeName: "node-a", Families: []v1.IPFamily{v1.IPv4Protocol}, ExternalIPs: true})}
}

func (w *world) service(name, clusterIP string, port int32, proto v1.Protocol) {
	w.tracker.OnService(nil, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, Ports: []v1.ServicePort{{Port: port, Protocol: proto}}},
	})
}

func (w *world) deleteService(name string) {
	w.tracker.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}, nil)
}

func (w *world) endpoints(service string, port int32, proto v1.Protocol, ips ...string) {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: service + "-1", Labels: map[string]string{discovery.LabelServiceName: service}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr(""), Port: ptr(port), Protocol: ptr(proto)}},
	}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{ip}})
	}
	w.tracker.OnEndpointSlice(nil, es)
}

func (w *world) snapshot() *proxy.Snapshot { return w.tracker.Snapshots().Snapshots[0] }

func ptr[T any](v T) *T { return &v }

func newTestDataplane(t *testing.T, k *fakeKernel, cfg Config) (*Dataplane, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return NewDataplane(cfg, k, nil, k, NewMetrics(reg, nil)), reg
}

func v4Config() Config {
	return with(testConfig(v1.IPv4Protocol, clusterCIDR("10.244.0.0/16")), func(c *Config) { c.LocalhostNodePorts = true })
}

// reach traces a new TCP connection from a client outside the node to ip:port.
func reachFrom(t *testing.T, k *fakeKernel, ip string, port uint16) []string {
	t.Helper()
	res, err := k.ts.Trace(iptrace.Packet{Src: netip.MustParseAddr("10.250.0.2"), Dst: netip.MustParseAddr(ip),
		Protocol: "tcp", DPort: port, InIface: "eth0", LocalAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}})
	if err != nil {
		t.Fatalf("trace %s:%d: %v", ip, port, err)
	}
	return res.Endpoints()
}

// fullRenderState is what a fresh kernel holds after a full sync of snap: the reference a sequence of
// partial syncs must converge to.
func fullRenderState(t *testing.T, cfg Config, snap *proxy.Snapshot) string {
	t.Helper()
	k := newFakeKernel()
	dp, _ := newTestDataplane(t, k, cfg)
	if err := dp.Apply(context.Background(), snap, true); err != nil {
		t.Fatalf("reference full sync: %v", err)
	}
	return k.ts.SaveAll()
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
			return sum
		}
	}
	return 0
}

func TestDataplaneFullThenPartialConverges(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	cfg := v4Config()
	dp, _ := newTestDataplane(t, k, cfg)
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2", "10.244.2.2")
	w.service("dns", "10.96.0.53", 53, v1.ProtocolUDP)
	w.endpoints("dns", 5353, v1.ProtocolUDP, "10.244.3.2")

	snap := w.snapshot()
	if err := dp.Apply(ctx, snap, false); err != nil { // the first sync is full whatever is asked
		t.Fatal(err)
	}
	if got := reachFrom(t, k, "10.96.0.10", 80); !slices.Equal(got, []string{"10.244.1.2:8080", "10.244.2.2:8080"}) {
		t.Fatalf("ClusterIP reaches %v", got)
	}
	if got, want := k.ts.SaveAll(), fullRenderState(t, cfg, snap); got != want {
		t.Fatalf("first sync differs from a full render:\n%s", diffLines(want, got))
	}

	// One endpoint change: a partial sync touches only that Service's chains.
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2", "10.244.4.2")
	snap = w.snapshot()
	if err := dp.Apply(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	partial := k.payloads[len(k.payloads)-1]
	if strings.Contains(partial, ":"+ServiceChainName(PrefixService, dnsName())+" ") {
		t.Errorf("partial sync rewrote the unchanged Service's chain:\n%s", partial)
	}
	if got := reachFrom(t, k, "10.96.0.10", 80); !slices.Equal(got, []string{"10.244.1.2:8080", "10.244.4.2:8080"}) {
		t.Fatalf("after the change ClusterIP reaches %v", got)
	}
	if got, want := k.ts.SaveAll(), fullRenderState(t, cfg, snap); got != want {
		t.Fatalf("partial sync diverged from a full render:\n%s", diffLines(want, got))
	}

	// Deleting a Service deletes its chains.
	w.deleteService("dns")
	snap = w.snapshot()
	if err := dp.Apply(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(k.ts.Chains("nat"), ServiceChainName(PrefixService, dnsName())) {
		t.Errorf("deleted Service's chain is still there")
	}
	if got, want := k.ts.SaveAll(), fullRenderState(t, cfg, snap); got != want {
		t.Fatalf("after deletion:\n%s", diffLines(want, got))
	}
}

func nn(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: name}
}

func dnsName() proxy.ServicePortName {
	return proxy.ServicePortName{NamespacedName: nn("dns"), Protocol: v1.ProtocolUDP}
}

func TestDataplaneFailureKeepsRulesAndNextSyncIsFull(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	dp, reg := newTestDataplane(t, k, v4Config())
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
	if err := dp.Apply(ctx, w.snapshot(), true); err != nil {
		t.Fatal(err)
	}
	before := k.ts.SaveAll()

	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.9.9")
	k.failRestore = errors.New("xtables lock held")
	if err := dp.Apply(ctx, w.snapshot(), false); err == nil {
		t.Fatal("Apply succeeded although the restore failed")
	}
	if k.ts.SaveAll() != before {
		t.Fatal("a failed sync changed the kernel")
	}
	if got := metricValue(t, reg, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"); got != 1 {
		t.Errorf("restore failures = %v, want 1", got)
	}
	if got := metricValue(t, reg, "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"); got != 1 {
		t.Errorf("partial restore failures = %v, want 1", got)
	}

	// The next sync, even if asked to be partial, rewrites everything and reaches the new state.
	k.failRestore = nil
	w.service("other", "10.96.0.11", 80, v1.ProtocolTCP)
	snap := w.snapshot()
	if err := dp.Apply(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	last := k.payloads[len(k.payloads)-1]
	if !strings.Contains(last, ":"+ServiceChainName(PrefixService, proxy.ServicePortName{NamespacedName: nn("web"), Protocol: v1.ProtocolTCP})+" ") {
		t.Errorf("sync after a failure was not full:\n%s", last)
	}
	if got := reachFrom(t, k, "10.96.0.10", 80); !slices.Equal(got, []string{"10.244.9.9:8080"}) {
		t.Fatalf("after recovery ClusterIP reaches %v", got)
	}
}

func TestDataplaneRemovesStaleChainsAndKeepsJumpsUnique(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	// Leftovers of an earlier run (or of upstream kube-proxy): a Service chain nobody wants any more, and
	// the jump rules already in place.
	stale := "KUBE-SVC-AAAAAAAAAAAAAAAA"
	if err := k.ts.Restore([]byte("*nat\n:KUBE-SERVICES - [0:0]\n:"+stale+" - [0:0]\n-A "+stale+" -j RETURN\nCOMMIT\n"), iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	dp, _ := newTestDataplane(t, k, v4Config())
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	for i := 0; i < 3; i++ {
		if err := dp.Apply(ctx, w.snapshot(), true); err != nil {
			t.Fatal(err)
		}
	}
	if slices.Contains(k.ts.Chains("nat"), stale) {
		t.Errorf("stale chain %s survived a full sync", stale)
	}
	for _, j := range JumpRules(v4Config()) {
		n := 0
		for _, r := range k.ts.Rules(j.Table, j.Chain) {
			if strings.Contains(r, "-j "+j.Target) && strings.Contains(r, j.Comment) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s/%s has %d jumps to %s after three full syncs, want 1", j.Table, j.Chain, n, j.Target)
		}
	}
}

// newMasqueradeBed is a dataplane that has synced one Service (10.96.0.10:80/TCP, one endpoint), and a
// probe: whether a pod's packet to that Service is marked for masquerading.
func newMasqueradeBed(t *testing.T) (*fakeKernel, *Dataplane, *world, func() bool) {
	t.Helper()
	k := newFakeKernel()
	dp, _ := newTestDataplane(t, k, v4Config())
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
	if err := dp.Apply(context.Background(), w.snapshot(), true); err != nil {
		t.Fatal(err)
	}
	masqueraded := func() bool {
		res, err := k.ts.Trace(iptrace.Packet{Src: netip.MustParseAddr("10.244.5.5"), Dst: netip.MustParseAddr("10.96.0.10"),
			Protocol: "tcp", DPort: 80, InIface: "veth5"})
		if err != nil {
			t.Fatal(err)
		}
		m, _ := res.Masquerade()
		return m
	}
	return k, dp, w, masqueraded
}

func TestDataplaneReconfigure(t *testing.T) {
	ctx := context.Background()
	_, dp, w, masqueraded := newMasqueradeBed(t)
	if masqueraded() {
		t.Fatal("pod-to-service traffic masqueraded without masqueradeAll")
	}
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16"
	c.IPTables.MasqueradeAll = true
	if err := dp.Reconfigure(c); err != nil {
		t.Fatal(err)
	}
	if !dp.Config().MasqueradeAll {
		t.Fatal("Reconfigure did not take masqueradeAll")
	}
	if err := dp.Apply(ctx, w.snapshot(), false); err != nil { // nothing changed in the API: still a full rewrite
		t.Fatal(err)
	}
	if !masqueraded() {
		t.Fatal("masqueradeAll not in force after the reconfigured sync")
	}
	bad := config.Default()
	bad.DetectLocalMode = "Elsewhere"
	if err := dp.Reconfigure(bad); err == nil {
		t.Fatal("Reconfigure accepted an unknown detectLocalMode")
	}
	if !dp.Config().MasqueradeAll {
		t.Fatal("a refused Reconfigure changed the config")
	}
}

// TestDataplaneReconfiguredDuringSync: a reload that lands while a sync writes what it rendered from the
// old configuration leaves the next sync full, so that the new configuration is written everywhere.
func TestDataplaneReconfiguredDuringSync(t *testing.T) {
	ctx := context.Background()
	k, dp, w, masqueraded := newMasqueradeBed(t)
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16"
	c.IPTables.MasqueradeAll = true
	k.onRestore = func() {
		k.onRestore = nil
		if err := dp.Reconfigure(c); err != nil {
			t.Error(err)
		}
	}
	w.service("other", "10.96.0.11", 80, v1.ProtocolTCP) // something to write
	if err := dp.Apply(ctx, w.snapshot(), false); err != nil {
		t.Fatal(err)
	}
	if k.onRestore != nil {
		t.Fatal("the partial sync wrote nothing")
	}
	if masqueraded() {
		t.Fatal("the sync that began before the reload wrote the new configuration")
	}
	before := len(k.payloads)
	if err := dp.Apply(ctx, w.snapshot(), false); err != nil {
		t.Fatal(err)
	}
	if len(k.payloads) == before {
		t.Fatal("the sync after the reload wrote nothing")
	}
	if !masqueraded() {
		t.Fatal("masqueradeAll not in force after the sync that followed the reload")
	}
}

func TestDataplaneWatchRestoresRemovedRules(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := newFakeKernel()
	dp, reg := newTestDataplane(t, k, v4Config())
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
	snap := w.snapshot()
	if err := dp.Apply(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	var resyncs atomic.Int32
	done := make(chan struct{})
	go func() { dp.Watch(ctx, time.Millisecond, func(bool) { resyncs.Add(1) }); close(done) }()

	// A firewall reload flushes the nat table: the jumps from PREROUTING/OUTPUT go.
	if _, err := k.ts.Run("-t", "nat", "-F"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for resyncs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("watcher did not notice the flushed nat table")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := metricValue(t, reg, "kubeproxy_iptables_rules_removed_externally_total"); got < 1 {
		t.Errorf("removed-externally metric = %v", got)
	}
	// The resync it asked for is full (the snapshot did not change) and restores the traffic.
	if err := dp.Apply(context.Background(), snap, false); err != nil {
		t.Fatal(err)
	}
	if got := reachFrom(t, k, "10.96.0.10", 80); !slices.Equal(got, []string{"10.244.1.2:8080"}) {
		t.Fatalf("after the resync ClusterIP reaches %v", got)
	}
}

// TestDataplaneFullSyncCountsRemovals: a periodic full sync that gets to removed jump rules before the
// watcher counts the removal once, also when its check could not see it (a removal racing the check, or a
// check that failed) and only re-adding the jumps shows it.
func TestDataplaneFullSyncCountsRemovals(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		failCheck error
	}{
		{"seen by the check", nil},
		{"seen only when re-adding the jumps", errors.New("iptables -C: resource temporarily unavailable")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel()
			dp, reg := newTestDataplane(t, k, v4Config())
			w := newWorld(t)
			w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
			w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
			snap := w.snapshot()
			for range 2 { // the first sync, then a periodic one with nothing removed
				if err := dp.Apply(ctx, snap, true); err != nil {
					t.Fatal(err)
				}
			}
			if got := metricValue(t, reg, "kubeproxy_iptables_rules_removed_externally_total"); got != 0 {
				t.Fatalf("removals counted with nothing removed: %v", got)
			}
			if _, err := k.ts.Run("-t", "nat", "-F"); err != nil {
				t.Fatal(err)
			}
			k.failCheck = tc.failCheck
			if err := dp.Apply(ctx, snap, true); err != nil {
				t.Fatal(err)
			}
			if got := metricValue(t, reg, "kubeproxy_iptables_rules_removed_externally_total"); got != 1 {
				t.Errorf("removed-externally metric = %v, want 1", got)
			}
			if got := reachFrom(t, k, "10.96.0.10", 80); !slices.Equal(got, []string{"10.244.1.2:8080"}) {
				t.Fatalf("after the periodic sync ClusterIP reaches %v", got)
			}
		})
	}
}

func TestCleanupRemovesOnlyOurs(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	// Another component's chain and rule, which must survive.
	if _, err := k.ts.Run("-t", "mangle", "-N", "KUBE-KUBELET-CANARY"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.ts.Run("-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	dp, _ := newTestDataplane(t, k, v4Config())
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
	if err := dp.Apply(ctx, w.snapshot(), true); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(ctx, k); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"nat", "filter", "mangle"} {
		for _, c := range k.ts.Chains(table) {
			// KUBE-FIREWALL (the localhost anti-martian rule, shared with kubelet) stays, as upstream leaves it.
			if strings.HasPrefix(c, "KUBE-") && c != "KUBE-KUBELET-CANARY" && c != "KUBE-FIREWALL" {
				t.Errorf("cleanup left %s/%s", table, c)
			}
		}
	}
	if !slices.Contains(k.ts.Chains("mangle"), "KUBE-KUBELET-CANARY") {
		t.Error("cleanup removed kubelet's chain")
	}
	for _, r := range k.ts.Rules("filter", "INPUT") {
		if !strings.Contains(r, "--dport 22") && !strings.Contains(r, "-j KUBE-FIREWALL") {
			t.Errorf("filter INPUT after cleanup still has %q", r)
		}
	}
	if rules := k.ts.Rules("filter", "INPUT"); !slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(r, "--dport 22") }) {
		t.Errorf("cleanup removed someone else's rule: filter INPUT is %q", rules)
	}
}

func TestConfigFrom(t *testing.T) {
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16,fd00:10:244::/48"
	c.NodePortAddresses = []string{"192.0.2.0/24", "primary", "2001:db8::/64"}
	c.IPTables.MasqueradeBit = ptr(int32(12))
	c.Conntrack.TCPBeLiberal = true
	got, err := ConfigFrom(c, v1.IPv6Protocol)
	if err != nil {
		t.Fatal(err)
	}
	want, err := proxy.SettingsFor(c, v1.IPv6Protocol)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, Config{Settings: want, TCPBeLiberal: true}) {
		t.Errorf("ConfigFrom(IPv6) = %+v, want the settings of proxy.SettingsFor %+v", got, want)
	}
	c.IPTables.MasqueradeBit = ptr(int32(32))
	if _, err := ConfigFrom(c, v1.IPv4Protocol); err == nil {
		t.Error("ConfigFrom accepted masqueradeBit 32")
	}
}

// diffLines shows the lines only in want (-) and only in got (+).
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// TestDataplaneLargePeriodicSync: at scale the periodic full sync checks and writes what changed instead of
// rewriting everything, unless rules were removed; small rulesets are rewritten every time.
func TestDataplaneLargePeriodicSync(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	dp, _ := newTestDataplane(t, k, v4Config())
	big := bigSnapshot(1100, 2)
	if err := dp.Apply(ctx, big, true); err != nil {
		t.Fatal(err)
	}
	n := len(k.payloads)
	if err := dp.Apply(ctx, big, true); err != nil {
		t.Fatal(err)
	}
	if len(k.payloads) != n {
		t.Fatalf("a periodic sync of an unchanged large ruleset wrote %d bytes", len(k.payloads[n]))
	}
	next := withChangedService(big, 7)
	if err := dp.Apply(ctx, next, true); err != nil {
		t.Fatal(err)
	}
	if p := k.payloads[len(k.payloads)-1]; strings.Count(p, "\n:") > 10 {
		t.Fatalf("a periodic sync with one change rewrote %d chains", strings.Count(p, "\n:"))
	}
	// Rules removed behind our back: the periodic sync notices and rewrites everything.
	if _, err := k.ts.Run("-t", "nat", "-F", "PREROUTING"); err != nil {
		t.Fatal(err)
	}
	if err := dp.Apply(ctx, next, true); err != nil {
		t.Fatal(err)
	}
	if p := k.payloads[len(k.payloads)-1]; strings.Count(p, "\n:") < 2000 {
		t.Fatalf("after a flush the periodic sync declared only %d chains", strings.Count(p, "\n:"))
	}
	if got, want := k.ts.SaveAll(), fullRenderState(t, v4Config(), next); got != want {
		t.Fatalf("after the repair:\n%.2000s", diffLines(want, got))
	}

	// A small ruleset is rewritten at every periodic sync.
	k2 := newFakeKernel()
	dp2, _ := newTestDataplane(t, k2, v4Config())
	small := bigSnapshot(10, 2)
	for range 2 {
		if err := dp2.Apply(ctx, small, true); err != nil {
			t.Fatal(err)
		}
	}
	if len(k2.payloads) != 2 || !strings.Contains(k2.payloads[1], ":KUBE-SERVICES") {
		t.Fatalf("small periodic sync did not rewrite: %d payloads", len(k2.payloads))
	}
}

// TestDataplaneChunkedWrite: with ChunkLines set (iptables-nft), a big sync goes in several restores that
// end in the same state as one.
func TestDataplaneChunkedWrite(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	cfg := v4Config()
	cfg.ChunkLines = 500
	dp, _ := newTestDataplane(t, k, cfg)
	snap := bigSnapshot(400, 3)
	if err := dp.Apply(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	if len(k.payloads) < 5 {
		t.Fatalf("%d restores for 400 Services in chunks of 500 rules", len(k.payloads))
	}
	plain := v4Config()
	if got, want := k.ts.SaveAll(), fullRenderState(t, plain, snap); got != want {
		t.Fatalf("chunked sync differs from a single one:\n%.2000s", diffLines(want, got))
	}
	// A failing transaction part way: the error surfaces and the next sync is full again.
	k.failRestore = errors.New("boom")
	if err := dp.Apply(ctx, withChangedService(snap, 3), false); err == nil {
		t.Fatal("Apply succeeded although a restore failed")
	}
	k.failRestore = nil
	n := len(k.payloads)
	next := withChangedService(snap, 3)
	if err := dp.Apply(ctx, next, false); err != nil {
		t.Fatal(err)
	}
	if len(k.payloads)-n < 5 {
		t.Fatalf("sync after a failure was not a full (chunked) one: %d restores", len(k.payloads)-n)
	}
	if got, want := k.ts.SaveAll(), fullRenderState(t, plain, next); got != want {
		t.Fatalf("after recovery:\n%.2000s", diffLines(want, got))
	}
}

// TestDataplaneChunkFailureKeepsMasquerade: when a chunked full sync after a masqueradeBit change fails
// part way, the mark KUBE-MARK-MASQ sets and the one KUBE-POSTROUTING masquerades are still the same, so
// traffic that needs SNAT gets it whichever chains were rewritten.
func TestDataplaneChunkFailureKeepsMasquerade(t *testing.T) {
	ctx := context.Background()
	snap := bigSnapshot(400, 3)
	masqueraded := func(k *fakeKernel, when string) {
		t.Helper()
		for _, ip := range []string{"10.96.0.1", "10.96.1.150"} { // the first and the last port's chunk
			res, err := k.ts.Trace(iptrace.Packet{Src: netip.MustParseAddr("10.250.0.2"), Dst: netip.MustParseAddr(ip),
				Protocol: "tcp", DPort: 80, InIface: "eth0", LocalAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outcomes) == 0 {
				t.Fatalf("%s: no outcome for %s", when, ip)
			}
			for _, o := range res.Outcomes {
				if o.Verdict != "ACCEPT" || !o.Masquerade {
					t.Errorf("%s: a connection from outside the cluster to %s: %s via %s, masqueraded %v, mark %#x",
						when, ip, o.Verdict, o.Endpoint, o.Masquerade, o.Mark)
				}
			}
		}
	}
	for failAfter := 0; failAfter < 5; failAfter++ {
		k := newFakeKernel()
		cfg := v4Config()
		cfg.ChunkLines = 500
		dp, _ := newTestDataplane(t, k, cfg)
		if err := dp.Apply(ctx, snap, true); err != nil {
			t.Fatal(err)
		}
		masqueraded(k, "bit 14")
		// A restart with another masqueradeBit, whose first sync fails after failAfter transactions.
		cfg.MasqueradeBit = 13
		dp, _ = newTestDataplane(t, k, cfg)
		k.failRestore, k.failAfter = errors.New("boom"), failAfter
		if err := dp.Apply(ctx, snap, true); err == nil {
			t.Fatalf("Apply succeeded although transaction %d failed", failAfter+1)
		}
		masqueraded(k, fmt.Sprintf("bit 13, transaction %d failed", failAfter+1))
	}
}

// TestConfigFromFollowsTheKernelsTCPBeLiberal: the INVALID drop is left out whenever the kernel's
// nf_conntrack_tcp_be_liberal is on, however it was set (as upstream), not only when the config sets it.
func TestConfigFromFollowsTheKernelsTCPBeLiberal(t *testing.T) {
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16"
	if got, err := ConfigFrom(c, v1.IPv4Protocol); err != nil || got.TCPBeLiberal {
		t.Fatalf("with the sysctl 0 and the field false: TCPBeLiberal %v (%v)", got.TCPBeLiberal, err)
	}
	setFakeSysctl(sysctl.Root, sysctlTCPBeLiberal, "1")
	t.Cleanup(func() { setFakeSysctl(sysctl.Root, sysctlTCPBeLiberal, "0") })
	got, err := ConfigFrom(c, v1.IPv4Protocol)
	if err != nil || !got.TCPBeLiberal {
		t.Fatalf("with the sysctl set by someone else: TCPBeLiberal %v (%v), want true", got.TCPBeLiberal, err)
	}
	w := newWorld(t)
	res, err := NewRenderer(got).Render(w.snapshot(), nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(res.Payload), "INVALID") {
		t.Error("the rules drop ctstate INVALID although nf_conntrack_tcp_be_liberal is on")
	}
}

// TestDataplaneRouteLocalnet: route_localnet is turned on only when NodePorts are really served on
// 127.0.0.1 for the node's resolved addresses: not for nodePortAddresses "primary" (CVE-2020-8558 class),
// and as soon as a reload makes them served.
func TestDataplaneRouteLocalnet(t *testing.T) {
	ctx := context.Background()
	setFakeSysctl(sysctl.Root, sysctlRouteLocalnet, "0") // other tests serve localhost NodePorts
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16"
	c.NodePortAddresses = []string{"primary"}
	cfg, err := ConfigFrom(c, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.LocalhostNodePorts {
		t.Fatal("the default config does not have localhostNodePorts on")
	}
	dp, _ := newTestDataplane(t, newFakeKernel(), cfg)
	w := newWorld(t)
	w.tracker.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.250.0.1"}}}})
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	if err := dp.Apply(ctx, w.snapshot(), true); err != nil {
		t.Fatal(err)
	}
	if got := fakeSysctl(t, sysctlRouteLocalnet); got != "0\n" {
		t.Errorf("with nodePortAddresses primary, route_localnet = %q, want it left at 0", got)
	}
	c.NodePortAddresses = []string{"127.0.0.0/8", "primary"}
	if err := dp.Reconfigure(c); err != nil {
		t.Fatal(err)
	}
	if err := dp.Apply(ctx, w.snapshot(), false); err != nil {
		t.Fatal(err)
	}
	if got := fakeSysctl(t, sysctlRouteLocalnet); got != "1" {
		t.Errorf("after a reload that serves NodePorts on 127.0.0.1, route_localnet = %q, want 1", got)
	}
	setFakeSysctl(sysctl.Root, sysctlRouteLocalnet, "0")
}

// TestDataplaneNFAcct: the first (full) sync creates upstream's nfacct counters before it writes rules
// naming them (the fake kernel refuses a rule naming a missing counter, as the kernel does); a kernel
// without nfacct, or a counter that cannot be created, gets the rules without that counter.
func TestDataplaneNFAcct(t *testing.T) {
	const invalidRule = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  " + CounterInvalidDropped + " -j DROP"
	tests := []struct {
		name          string
		nfacct        bool   // the kernel has nfacct
		failCounter   string // creating this counter fails
		wantCounters  []string
		wantInvalid   bool // the INVALID drop counts
		wantLocalhost bool // the localhost NodePort copy is written
	}{
		{name: "kernel with nfacct", nfacct: true, wantCounters: []string{CounterInvalidDropped, CounterLocalhostNodePorts},
			wantInvalid: true, wantLocalhost: true},
		{name: "kernel without nfacct"},
		{name: "localhost counter refused", nfacct: true, failCounter: CounterLocalhostNodePorts,
			wantCounters: []string{CounterInvalidDropped}, wantInvalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel()
			k.failCounter = tt.failCounter
			var acct accounting
			if tt.nfacct {
				acct = k
			}
			dp := NewDataplane(v4Config(), k, nil, acct, NewMetrics(prometheus.NewRegistry(), nil))
			w := newWorld(t)
			w.tracker.OnService(nil, &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
				Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
					IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, Ports: []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}},
			})
			w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
			if err := dp.Apply(context.Background(), w.snapshot(), false); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(k.counters, tt.wantCounters) {
				t.Errorf("counters %v, want %v", k.counters, tt.wantCounters)
			}
			if got := slices.Contains(strings.Split(k.ts.Save("filter"), "\n"), invalidRule); got != tt.wantInvalid {
				t.Errorf("INVALID drop counted: %v, want %v:\n%s", got, tt.wantInvalid, k.ts.Save("filter"))
			}
			counted := slices.ContainsFunc(k.ts.Rules("nat", chainNodePorts), func(r string) bool {
				return strings.HasPrefix(r, "-d 127.0.0.0/8 ") && strings.Contains(r, "--nfacct-name  "+CounterLocalhostNodePorts)
			})
			if counted != tt.wantLocalhost {
				t.Errorf("localhost NodePort copy written: %v, want %v:\n%s", counted, tt.wantLocalhost, k.ts.Save("nat"))
			}
			// Counted or not, the node's own connections to 127.0.0.1:30080 reach the endpoint.
			res, err := k.ts.Trace(iptrace.Packet{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.1"),
				Protocol: "tcp", DPort: 30080, Local: true, LocalAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Endpoints(); !slices.Equal(got, []string{"10.244.1.2:8080"}) {
				t.Errorf("127.0.0.1:30080 reaches %v, want 10.244.1.2:8080:\n%s", got, res)
			}
		})
	}
}

// TestDataplaneReconfigureKeepsCounters: a reload of an unchanged file keeps the counters the kernel has
// (they are not in the file) and the syncs partial.
func TestDataplaneReconfigureKeepsCounters(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	c := config.Default()
	c.ClusterCIDR = "10.244.0.0/16"
	cfg, err := ConfigFrom(c, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	dp, _ := newTestDataplane(t, k, cfg)
	w := newWorld(t)
	w.service("web", "10.96.0.10", 80, v1.ProtocolTCP)
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.2")
	if err := dp.Apply(ctx, w.snapshot(), true); err != nil {
		t.Fatal(err)
	}
	if got := dp.Config().NFAcct; got != allCounters {
		t.Fatalf("after the first sync NFAcct = %+v, want %+v", got, allCounters)
	}
	if err := dp.Reconfigure(c); err != nil {
		t.Fatal(err)
	}
	if got := dp.Config().NFAcct; got != allCounters {
		t.Errorf("after a reload NFAcct = %+v, want %+v", got, allCounters)
	}
	w.endpoints("web", 8080, v1.ProtocolTCP, "10.244.1.3")
	if err := dp.Apply(ctx, w.snapshot(), false); err != nil {
		t.Fatal(err)
	}
	if last := k.payloads[len(k.payloads)-1]; strings.Contains(last, ":"+chainForward+" ") {
		t.Errorf("the sync after an unchanged reload rewrote everything:\n%s", last)
	}
}
