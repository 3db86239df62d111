package nftables

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// staleDeadline is how soon after a Service's deletion its chains must be gone: upstream deletes them
// about a second after it flushed them (its stale-chain delay) even when nothing else changes; a few
// seconds of slack on top.
const staleDeadline = 5 * time.Second

// TestStaleChainsDeleted deletes a Service while the proxy runs and nothing else changes, and times how
// long its flushed chains stay in the table: upstream kube-proxy first (for reference), then ours, which
// must delete them within staleDeadline as upstream does.
//
// (A Service deleted while the proxy is down is another matter: both upstream and ours flush its chains in
// their first sync and delete them at a later sync, up to syncPeriod later.)
func TestStaleChainsDeleted(t *testing.T) {
	b := newBed(t, 2)
	for _, name := range []string{"keep", "up", "ours"} {
		b.CreateService(t, name, nil)
		b.SetEndpoints(t, name, harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	}
	chainsOf := func(svc string) []string {
		return []string{b.svcChain("service-", svc, "tcp"), b.svcChain("service-", svc, "udp")}
	}
	// deleteAndTime deletes Service svc, checks that its chains are flushed and that nothing refers to
	// them any more, and returns how long the chains took to leave table ip kube-proxy (0: longer than
	// 2*staleDeadline).
	deleteAndTime := func(t *testing.T, svc string) time.Duration {
		t.Helper()
		chains := chainsOf(svc)
		deleted := time.Now()
		b.DeleteService(t, svc)
		harness.Eventually(t, "the chains of "+svc+" to be flushed", 10*time.Second, func() (bool, string) {
			tab := b.table(t, "ip")
			for _, c := range chains {
				if blk := tab.Block("chain", c); blk != nil && len(blk.Rules()) > 0 {
					return false, c + " still has rules"
				}
			}
			for _, blk := range tab.Blocks {
				for _, l := range slices.Concat(blk.Lines, blk.Elements) {
					if strings.Contains(l, b.NS+"/"+svc+"/") {
						return false, blk.Key() + " still refers to " + svc
					}
				}
			}
			return true, ""
		})
		for time.Since(deleted) < 2*staleDeadline {
			if ok, _ := chainsAre(b.table(t, "ip"), nil, chains); ok {
				return time.Since(deleted)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return 0
	}
	show := func(d time.Duration) string {
		if d == 0 {
			return "still there after " + (2 * staleDeadline).String()
		}
		return "gone after " + d.Round(time.Millisecond).String()
	}

	up := harness.StartUpstream(t, b.Cluster, b.Topo.Node, harness.UpstreamOptions{NodeName: b.Node, Config: baseConfig + syncConfig, Kubeconfig: b.Kubeconfig})
	b.waitSettled(t, chainsOf("up"))
	upstream := deleteAndTime(t, "up")
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("upstream: the chains of a Service deleted while it ran: %s", show(upstream))

	b.start("")
	b.waitSettled(t, chainsOf("ours"))
	ours := deleteAndTime(t, "ours")
	t.Logf("ours: the chains of a Service deleted while it ran: %s", show(ours))
	if ours == 0 || ours > staleDeadline {
		t.Errorf("the flushed chains of a deleted Service stay until an unrelated sync (%s; syncPeriod is 30s), "+
			"where upstream deletes them after its stale-chain delay (%s)", show(ours), show(upstream))
	}
}
