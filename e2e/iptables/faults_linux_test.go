package iptables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/e2e/harness"
)

// natJumps are the jumps from built-in nat chains that must exist exactly once.
var natJumps = []string{
	"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
	"-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
	"-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
}

// TestFlushedRulesRestored removes our rules by hand, three ways, and checks that the daemon notices
// within its syncPeriod (2 s here), restores them (jumps exactly once), counts each time in
// kubeproxy_iptables_rules_removed_externally_total, and that traffic flows again.
func TestFlushedRulesRestored(t *testing.T) {
	for _, backend := range []string{harness.BackendNFT, harness.BackendLegacy} {
		t.Run(backend, func(t *testing.T) { flushCases(t, backend) })
	}
}

func flushCases(t *testing.T, backend string) {
	b := newBed(t, backend, 2)
	web := b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	d := b.start("iptables:\n  syncPeriod: 2s\n  minSyncPeriod: 0s\n")
	addr := harness.HostPort(web.Spec.ClusterIP, svcTCP)
	harness.ExpectSpread(t, "before", harness.HitForTest(t, b.Topo.Client, "tcp", addr, 30, harness.HitOptions{}), harness.PodNames(1, 2), nil)
	svc := b.svcChain("KUBE-SVC", "web", "tcp")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ipt := func(t *testing.T, args ...string) {
		t.Helper()
		if _, err := b.xt.IPTables(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	b.CreateService(t, "aux", nil)
	b.SetEndpoints(t, "aux", harness.ReadyEndpoint(1))
	restoredAt := func(t *testing.T) time.Time {
		t.Helper()
		var at time.Time
		deadline := time.Now().Add(15 * time.Second)
		for at.IsZero() {
			if slices.Contains(b.save(t, "nat").Rules, natJumps[0]) {
				at = time.Now()
			} else if time.Now().After(deadline) {
				t.Fatalf("our rules were not restored within 15 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return at
	}
	// The watcher and the periodic full sync both run every syncPeriod, at phases of their own; whichever
	// gets to a removal first restores it, and each removal must be counted once. Flushes spread over one
	// period land before either, and some during a full sync.
	t.Run("FlushAtEveryPhaseOfTheSyncPeriod", func(t *testing.T) {
		before := removedExternally(t, d)
		ipt(t, "-t", "nat", "-F")
		last := restoredAt(t)
		offsets := []time.Duration{300 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond}
		for i, off := range offsets {
			if i == 1 {
				b.SetEndpoints(t, "aux", harness.ReadyEndpoint(2)) // and a partial sync in between
			}
			time.Sleep(time.Until(last.Add(off)))
			ipt(t, "-t", "nat", "-F")
			flushed := time.Now()
			last = restoredAt(t)
			t.Logf("flush %v after the last repair restored %v after it", off, last.Sub(flushed).Round(time.Millisecond))
		}
		harness.Eventually(t, "every removal to be counted", 5*time.Second, func() (bool, string) {
			got := removedExternally(t, d)
			want := before + float64(len(offsets)+1)
			return got == want, fmt.Sprintf("kubeproxy_iptables_rules_removed_externally_total went from %v to %v, want %v", before, got, want)
		})
	})
	for _, c := range []struct {
		name  string
		flush func(t *testing.T)
	}{
		{"FlushNAT", func(t *testing.T) { ipt(t, "-t", "nat", "-F") }},
		{"DeleteOurNATChains", func(t *testing.T) {
			ipt(t, "-t", "nat", "-F")
			for _, c := range b.save(t, "nat").ChainNames("KUBE-") {
				ipt(t, "-t", "nat", "-X", c)
			}
		}},
		{"FirewallReload", func(t *testing.T) {
			for _, table := range []string{"filter", "nat", "mangle"} {
				ipt(t, "-t", table, "-F")
				ipt(t, "-t", table, "-X")
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := removedExternally(t, d)
			c.flush(t)
			flushed := time.Now()
			harness.Eventually(t, "our rules back", 15*time.Second, func() (bool, string) {
				nat := b.save(t, "nat")
				if _, ok := nat.Chains[svc]; !ok {
					return false, svc + " missing"
				}
				for _, j := range natJumps {
					if !slices.Contains(nat.Rules, j) {
						return false, "missing " + j
					}
				}
				return true, ""
			})
			t.Logf("restored %v after the flush", time.Since(flushed).Round(time.Millisecond))
			nat := b.save(t, "nat")
			for _, j := range natJumps {
				if n := countOf(nat.Rules, j); n != 1 {
					t.Errorf("%d copies of %s", n, j)
				}
			}
			expectNoDuplicates(t, backend+" after "+c.name, saveAll(t, b.xt))
			harness.ExpectSpread(t, "after "+c.name, harness.HitForTest(t, b.Topo.Client, "tcp", addr, 30, harness.HitOptions{}), harness.PodNames(1, 2), nil)
			harness.Eventually(t, "the removal to be counted", 5*time.Second, func() (bool, string) {
				got := removedExternally(t, d)
				return got == before+1, fmt.Sprintf("kubeproxy_iptables_rules_removed_externally_total went from %v to %v, want +1", before, got)
			})
		})
	}
}

func removedExternally(t testing.TB, d *harness.Daemon) float64 {
	t.Helper()
	v, found := d.Metric(t, "kubeproxy_iptables_rules_removed_externally_total", `ip_family="IPv4"`)
	if !found {
		t.Fatalf("no IPv4 kubeproxy_iptables_rules_removed_externally_total in /metrics")
	}
	return v
}

func countOf(list []string, s string) int {
	n := 0
	for _, l := range list {
		if l == s {
			n++
		}
	}
	return n
}

// expectNoDuplicates fails t when any chain of any saved table holds the same rule twice.
func expectNoDuplicates(t *testing.T, label string, saves map[string]*harness.SavedTable) {
	t.Helper()
	for key, tab := range saves {
		seen := map[string]int{}
		for _, r := range tab.Rules {
			seen[r]++
		}
		for r, n := range seen {
			if n > 1 {
				t.Errorf("%s: %s holds %d copies of %s", label, key, n, r)
			}
		}
	}
}

// TestXtablesLockHeld holds the xtables lock (a file private to the test, which both the holder and the
// daemon are pointed at through XTABLES_LOCKFILE, so the host's /run/xtables.lock is never involved) for
// 3 s while a Service appears: the legacy backend's iptables-restore waits for it (-w 5) and the sync
// succeeds once the lock is free, without a failure.
func TestXtablesLockHeld(t *testing.T) {
	harness.RequireCluster(t, "flock")
	b := newBed(t, harness.BackendLegacy, 2)
	b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1))
	d := b.start("")
	flags := t.TempDir()
	held, released := filepath.Join(flags, "held"), filepath.Join(flags, "released")
	holder := exec.Command("flock", "-x", b.xt.LockFile, "sh", "-c", "touch "+held+"; sleep 3; touch "+released)
	proc, err := harness.StartProcess("flock holder", holder, filepath.Join(flags, "flock.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop(syscall.SIGTERM, 5*time.Second) })
	harness.Eventually(t, "the lock to be held", 10*time.Second, func() (bool, string) {
		_, err := os.Stat(held)
		return err == nil, "not yet"
	})
	heldAt := time.Now()

	late := b.CreateService(t, "late", nil)
	b.SetEndpoints(t, "late", harness.ReadyEndpoint(2))
	lateChain := b.svcChain("KUBE-SVC", "late", "tcp")
	var waiting []string
	var appliedAt time.Time
	heldNow := func() bool { _, err := os.Stat(released); return err != nil }
	harness.Eventually(t, "late's rules", 20*time.Second, func() (bool, string) {
		if waiting == nil && heldNow() {
			for _, c := range harness.Children(d.Proc.PID()) {
				if len(c.Args) > 0 && strings.Contains(c.Args[0], "restore") {
					waiting = c.Args
				}
			}
		}
		if _, ok := b.save(t, "nat").Chains[lateChain]; !ok {
			return false, "not there yet"
		}
		// Checked after the save: the holder writes "released" before it lets go of the lock.
		if heldNow() {
			t.Errorf("late's rules were written while the lock was held")
		}
		appliedAt = time.Now()
		return true, ""
	})
	t.Logf("lock held at +0, late's rules applied at +%v; iptables-restore seen waiting: %q",
		appliedAt.Sub(heldAt).Round(time.Millisecond), waiting)
	if waiting == nil {
		t.Errorf("never saw the daemon's iptables-restore waiting for the lock")
	}
	harness.ExpectSpread(t, "client -> late", harness.HitForTest(t, b.Topo.Client, "tcp", harness.HostPort(late.Spec.ClusterIP, svcTCP), 10, harness.HitOptions{}), harness.PodNames(2), nil)
	if got := restoreFailures(t, d); got != 0 {
		t.Errorf("%v iptables-restore failures while the lock was held", got)
	}
	if strings.Contains(d.Proc.Log(), "Sync failed") {
		t.Errorf("a sync failed while the lock was held:\n%s", d.Proc.LogTail(20))
	}
}

// killDuringRestore polls the daemon's children for an iptables-restore that has been running for at
// least 50 ms (a large payload: small ones finish sooner), kills the daemon with SIGKILL right then, and
// waits for the orphaned restore to end. It returns the restore's command line and how long it had run.
func killDuringRestore(t *testing.T, d *harness.Daemon) ([]string, time.Duration) {
	t.Helper()
	pid := d.Proc.PID()
	deadline := time.Now().Add(60 * time.Second)
	firstSeen := map[int]time.Time{}
	for {
		for _, c := range harness.Children(pid) {
			if len(c.Args) == 0 || !strings.Contains(c.Args[0], "restore") {
				continue
			}
			seen, ok := firstSeen[c.PID]
			if !ok {
				firstSeen[c.PID] = time.Now()
				continue
			}
			ran := time.Since(seen)
			if ran < 50*time.Millisecond {
				continue
			}
			if err := d.Proc.Signal(syscall.SIGKILL); err != nil {
				t.Fatalf("kill -9: %v", err)
			}
			<-d.Proc.Done()
			harness.Eventually(t, "the orphaned iptables-restore to end", 30*time.Second, func() (bool, string) {
				return !harness.ProcAlive(c.PID), fmt.Sprintf("pid %d still running", c.PID)
			})
			return c.Args, ran
		}
		if d.Proc.Exited() {
			t.Fatalf("daemon exited on its own: %v", d.Proc.ExitErr())
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw a long iptables-restore child")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// expectConverged checks the node's rules after a sync: each jump from a built-in chain once, no rule
// twice, and no per-Service chain that nothing jumps to (a stale chain).
func expectConverged(t *testing.T, b *bed, label string) {
	t.Helper()
	saves := saveAll(t, b.xt)
	expectNoDuplicates(t, label, saves)
	for _, fam := range []string{"IPv4", "IPv6"} {
		nat := saves[fam+"/nat"]
		for _, j := range natJumps {
			if n := countOf(nat.Rules, j); n != 1 {
				t.Errorf("%s: %s nat holds %d copies of %s", label, fam, n, j)
			}
		}
		referenced := map[string]bool{}
		for _, r := range nat.Rules {
			if i := strings.Index(r, " -j "); i >= 0 {
				referenced[strings.Fields(r[i+4:])[0]] = true
			}
		}
		for _, c := range nat.ChainNames("KUBE-") {
			if !referenced[c] && c != "KUBE-PROXY-CANARY" && !strings.HasPrefix(c, "KUBE-MARK-") {
				t.Errorf("%s: %s nat chain %s is stale: nothing jumps to it", label, fam, c)
			}
		}
	}
}

// TestKillDuringSync kills the daemon with SIGKILL while an iptables-restore of a large payload runs
// (first at start-up, then during a partial sync), changes the Services while it is down, and checks
// that the next start converges: no duplicate rules, jumps exactly once, no stale chain, traffic as the
// Services say.
func TestKillDuringSync(t *testing.T) {
	b := newBed(t, harness.BackendNFT, 3)
	b.BigService(t, "big", 3000)
	web := b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	b.CreateService(t, "doomed", nil)
	b.SetEndpoints(t, "doomed", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	doomed := []string{b.svcChain("KUBE-SVC", "doomed", "tcp"), b.sepChain("doomed", "tcp", 1)}

	// 1. Killed during the first, full sync.
	d := harness.StartDaemon(t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
		NodeName: b.Node, Config: baseConfig + syncConfig, Env: []string{b.xt.Env()}, Kubeconfig: b.Kubeconfig,
		NoWaitReady: true,
	})
	args, ran := killDuringRestore(t, d)
	_, committed := b.save(t, "nat").Chains[b.svcChain("KUBE-SVC", "big", "tcp")]
	t.Logf("killed %v into %q at start-up (the payload was committed before the kill: %v)", ran, args, committed)
	b.DeleteService(t, "doomed")
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	start := time.Now()
	d.Start()
	d.WaitReady(60 * time.Second)
	t.Logf("restarted: ready after %v", time.Since(start).Round(time.Millisecond))
	b.waitChains(t, []string{b.svcChain("KUBE-SVC", "web", "tcp")}, append(doomed, b.sepChain("web", "tcp", 3)))
	expectConverged(t, b, "after a kill at start-up")
	harness.ExpectSpread(t, "client -> web", harness.HitForTest(t, b.Topo.Client, "tcp", harness.HostPort(web.Spec.ClusterIP, svcTCP), 20, harness.HitOptions{}), harness.PodNames(1, 2), nil)

	// 2. Killed during a partial sync: a second large Service arrives, and is deleted while the daemon is
	// down; pod3 comes back to web.
	b.BigService(t, "big2", 3000)
	args, ran = killDuringRestore(t, d)
	_, committed = b.save(t, "nat").Chains[b.svcChain("KUBE-SVC", "big2", "tcp")]
	t.Logf("killed %v into %q in a partial sync (the payload was committed before the kill: %v)", ran, args, committed)
	ctx, cancel := b.Ctx()
	defer cancel()
	if err := b.Cluster.Admin.CoreV1().Services(b.NS).Delete(ctx, "big2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=big2"}); err != nil {
		t.Fatal(err)
	}
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	d.Start()
	d.WaitReady(60 * time.Second)
	b.waitChains(t, []string{b.sepChain("web", "tcp", 3), b.svcChain("KUBE-SVC", "big", "tcp")}, []string{b.svcChain("KUBE-SVC", "big2", "tcp")})
	expectConverged(t, b, "after a kill during a partial sync")
	nat := b.save(t, "nat")
	left := 0
	for i := range 3000 {
		for _, port := range []string{"tcp", "udp"} {
			target := podTCP
			if port == "udp" {
				target = podUDP
			}
			if _, ok := nat.Chains[hashName("KUBE-SEP", b.PortName("big2", port), port, fmt.Sprintf("%s:%d", harness.BigServiceAddr(i), target))]; ok {
				left++
			}
		}
	}
	if left > 0 {
		t.Errorf("%d endpoint chains of the deleted big2 survived", left)
	}
	if n := len(nat.ChainNames("KUBE-SEP-")); n < 6000 {
		t.Errorf("only %d KUBE-SEP chains; big alone has 6000", n)
	}
	harness.ExpectSpread(t, "client -> web", harness.HitForTest(t, b.Topo.Client, "tcp", harness.HostPort(web.Spec.ClusterIP, svcTCP), 30, harness.HitOptions{}), harness.PodNames(1, 2, 3), nil)
}
