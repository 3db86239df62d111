package iptables

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// unordered are the chains whose rule order upstream leaves to Go's map iteration (one rule per Service
// port address, never overlapping), so only their contents are compared.
var unordered = []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-FIREWALL"}

// TestUpstreamHandover runs upstream kube-proxy, then ours, then upstream again in the same node namespace
// with traffic flowing all along: no connection may fail, each one's first sync removes the chains of a
// Service deleted while nothing ran, and both write the same chains (and, known differences aside, the
// same rules) for the same Services.
func TestUpstreamHandover(t *testing.T) {
	b := newBed(t, harness.BackendNFT, 3)
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	b.CreateService(t, "sticky", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
	b.SetEndpoints(t, "sticky", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	b.CreateService(t, "local", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	b.SetEndpoints(t, "local", harness.ReadyEndpoint(1), harness.RemoteEndpoint(2))
	b.CreateService(t, "itp", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal) })
	b.SetEndpoints(t, "itp", harness.ReadyEndpoint(3), harness.RemoteEndpoint(1))
	b.CreateService(t, "empty", nil)
	b.CreateService(t, "gone", nil)
	b.SetEndpoints(t, "gone", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	var goneChains []string
	for _, port := range []string{"tcp", "udp"} {
		goneChains = append(goneChains, b.svcChain("KUBE-SVC", "gone", port), b.sepChain("gone", port, 1), b.sepChain("gone", port, 2))
	}
	upOpts := harness.UpstreamOptions{NodeName: b.Node, Config: baseConfig + syncConfig, Env: []string{b.xt.Env()}, Kubeconfig: b.Kubeconfig}
	targets := []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIP, svcTCP)},
		{Network: "udp", Addr: harness.HostPort(web.Spec.ClusterIP, svcUDP)},
		{Network: "tcp", Addr: harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))},
	}

	// Upstream first.
	start := time.Now()
	up := harness.StartUpstream(t, b.Cluster, b.Topo.Node, upOpts)
	b.waitChains(t, append([]string{b.svcChain("KUBE-SVC", "web", "tcp")}, goneChains...), nil)
	upstream := waitSettled(t, b.xt)
	t.Logf("upstream kube-proxy synced both families %v after start", time.Since(start).Round(time.Millisecond))

	// Upstream -> ours, with traffic flowing; "gone" is deleted while no proxy runs.
	tr := harness.StartTraffic(b.Topo.Client, targets)
	tr.WaitFor(t, 60)
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	b.DeleteService(t, "gone")
	tr.WaitMore(t, 60)
	d := b.start(syncConfig)
	ours := saveAll(t, b.xt) // right after READY=1: the first sync is done
	for _, c := range goneChains {
		if _, ok := ours["IPv4/nat"].Chains[c]; ok {
			t.Errorf("after our first sync, upstream's chain %s of the deleted Service is still there", c)
		}
	}
	tr.WaitMore(t, 120)
	harness.ExpectNoFailures(t, "upstream -> ours", tr.Stop())
	if got := restoreFailures(t, d); got != 0 {
		t.Errorf("our first sync over upstream's rules: %v restore failures", got)
	}

	// The same Services, the same chains: compare with what upstream wrote (minus the deleted Service).
	for key, up := range upstream {
		compareSaves(t, b, key, up, ours[key], goneChains)
	}
	// Both count in upstream's nfacct counters, which the comparison above covers only if they are there.
	for key, want := range map[string]string{
		"IPv4/filter": "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP",
		"IPv4/nat":    "-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment",
	} {
		if !slices.ContainsFunc(ours[key].Rules, func(r string) bool { return strings.HasPrefix(r, want) && strings.Contains(r, " -m nfacct ") }) {
			t.Errorf("%s: no rule counting in an nfacct counter like %q", key, want)
		}
	}

	// Ours -> upstream: a Service created under us and deleted while nothing runs must go too.
	b.CreateService(t, "gone2", nil)
	b.SetEndpoints(t, "gone2", harness.ReadyEndpoint(3))
	gone2 := []string{b.svcChain("KUBE-SVC", "gone2", "tcp"), b.sepChain("gone2", "tcp", 3)}
	b.waitChains(t, gone2, nil)
	tr = harness.StartTraffic(b.Topo.Client, targets)
	tr.WaitFor(t, 60)
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	b.DeleteService(t, "gone2")
	start = time.Now()
	up2 := harness.StartUpstream(t, b.Cluster, b.Topo.Node, upOpts)
	b.waitChains(t, nil, gone2)
	t.Logf("upstream kube-proxy removed our stale chains %v after start", time.Since(start).Round(time.Millisecond))
	tr.WaitMore(t, 120)
	harness.ExpectNoFailures(t, "ours -> upstream", tr.Stop())
	back := saveAll(t, b.xt)
	for key, o := range ours {
		if a, z := chainSet(o), chainSet(back[key]); !slices.Equal(a, z) {
			t.Errorf("%s: upstream's chains after ours differ from ours:\nours     %v\nupstream %v", key, a, z)
		}
	}

	// Our --cleanup removes what upstream left, kubelet's KUBE-FIREWALL aside.
	if err := up2.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	bin, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := b.Ctx()
	defer cancel()
	if out, err := b.Topo.Node.RunEnv(ctx, []string{b.xt.Env()}, bin, "--cleanup"); err != nil {
		t.Fatalf("kube-proxy --cleanup over upstream's rules: %v\n%s", err, out)
	}
	for _, c := range b.xt.KubeChains(t) {
		if !othersChain(c) {
			t.Errorf("--cleanup left upstream's %s", c)
		}
	}
}

// waitSettled waits until both families have their full rule set (upstream syncs each family on its own
// goroutine, so READY-like signals cover one family at most) and two saves in a row are equal, and
// returns the last save.
func waitSettled(t testing.TB, xt *harness.XTables) map[string]*harness.SavedTable {
	t.Helper()
	var prev, cur map[string]*harness.SavedTable
	harness.Eventually(t, "the rules of both families to settle", 30*time.Second, func() (bool, string) {
		prev, cur = cur, saveAll(t, xt)
		for _, fam := range []string{"IPv4", "IPv6"} {
			nat, filter := cur[fam+"/nat"], cur[fam+"/filter"]
			if len(nat.RulesOf("KUBE-POSTROUTING")) == 0 || len(filter.RulesOf("KUBE-FORWARD")) == 0 ||
				!slices.ContainsFunc(filter.RulesOf("INPUT"), func(r string) bool { return strings.HasSuffix(r, "-j KUBE-FIREWALL") }) {
				return false, fam + " not fully synced"
			}
		}
		if prev == nil {
			return false, "first save"
		}
		for k, v := range cur {
			if !slices.Equal(v.Rules, prev[k].Rules) || !slices.Equal(chainSet(v), chainSet(prev[k])) {
				return false, k + " still changing"
			}
		}
		return true, ""
	})
	return cur
}

// saveAll returns the nat and filter tables of both families, keyed "IPv4/nat" and so on.
func saveAll(t testing.TB, xt *harness.XTables) map[string]*harness.SavedTable {
	t.Helper()
	out := map[string]*harness.SavedTable{}
	for _, ipv6 := range []bool{false, true} {
		fam := "IPv4"
		if ipv6 {
			fam = "IPv6"
		}
		for _, table := range []string{"nat", "filter"} {
			out[fam+"/"+table] = saveTable(t, xt, ipv6, table)
		}
	}
	return out
}

// chainSet returns the sorted KUBE-* chain names of a table.
func chainSet(s *harness.SavedTable) []string {
	if s == nil {
		return nil
	}
	return s.ChainNames("KUBE-")
}

// compareSaves checks that ours has exactly upstream's KUBE-* chains (except those in skip) and the same
// rules, nfacct matches and upstream's counted copies of the NodePort rules for 127.0.0.1 included.
func compareSaves(t *testing.T, b *bed, key string, up, ours *harness.SavedTable, skip []string) {
	t.Helper()
	var upChains []string
	for _, c := range chainSet(up) {
		if !slices.Contains(skip, c) {
			upChains = append(upChains, c)
		}
	}
	if oc := chainSet(ours); !slices.Equal(upChains, oc) {
		t.Errorf("%s: chains differ:\nupstream %v\nours     %v", key, upChains, oc)
	}
	relevant := func(r string) bool {
		for _, c := range skip {
			if strings.Contains(r, c) {
				return false
			}
		}
		return !strings.Contains(r, b.NS+"/gone")
	}
	upRules, ourRules := map[string]int{}, map[string]int{}
	for _, r := range up.Rules {
		if !relevant(r) {
			continue
		}
		upRules[r]++
	}
	for _, r := range ours.Rules {
		ourRules[r]++
	}
	for r, n := range upRules {
		if ourRules[r] != n {
			t.Errorf("%s: upstream has %d, ours %d of: %s", key, n, ourRules[r], r)
		}
	}
	for r, n := range ourRules {
		if _, ok := upRules[r]; !ok {
			t.Errorf("%s: ours only (%d): %s", key, n, r)
		}
	}
	// Order matters within a chain (first match wins): compare each chain's rule order, except where
	// upstream's own order is random.
	for _, c := range upChains {
		if slices.Contains(unordered, c) {
			continue
		}
		var u []string
		for _, r := range up.RulesOf(c) {
			if relevant(r) {
				u = append(u, r)
			}
		}
		if o := ours.RulesOf(c); !slices.Equal(u, o) {
			t.Errorf("%s: chain %s in another order:\nupstream:\n%s\nours:\n%s", key, c, strings.Join(u, "\n"), strings.Join(o, "\n"))
		}
	}
	// The jump to KUBE-NODEPORTS must stay last in KUBE-SERVICES.
	if svcs := ours.RulesOf("KUBE-SERVICES"); strings.HasSuffix(key, "/nat") && (len(svcs) == 0 || !strings.HasSuffix(svcs[len(svcs)-1], "-j KUBE-NODEPORTS")) {
		t.Errorf("%s: the last rule of KUBE-SERVICES is not the jump to KUBE-NODEPORTS: %v", key, svcs)
	}
	for _, builtin := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
		u, o := up.RulesOf(builtin), ours.RulesOf(builtin)
		if !slices.Equal(u, o) {
			t.Errorf("%s: built-in chain %s differs:\nupstream:\n%s\nours:\n%s", key, builtin, strings.Join(u, "\n"), strings.Join(o, "\n"))
		}
	}
}

// restoreFailures sums kubeproxy_sync_proxy_rules_iptables_restore_failures_total over the families.
func restoreFailures(t testing.TB, d *harness.Daemon) float64 {
	t.Helper()
	return d.MetricOverFamilies(t, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total")
}
