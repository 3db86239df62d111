package nftables

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// waitTables waits (timeout at most) until both families' tables read, normalised, as want, and returns
// how long that took.
func (b *bed) waitTables(t testing.TB, what string, want map[string]string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var got map[string]string
	deadline := start.Add(timeout)
	for {
		got = normalized(b.listings(t))
		if got["ip"] == want["ip"] && got["ip6"] == want["ip6"] {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, fam := range families {
		if got[fam] != want[fam] {
			t.Errorf("table %s kube-proxy (- want, + got):\n%s", fam, lineDiff(want[fam], got[fam]))
		}
	}
	t.Fatalf("%s: the tables were not as before within %v", what, timeout)
	return 0
}

// counts returns kubeproxy_nftables_changed_externally_total of both families.
func counts(t testing.TB, d *harness.Daemon) [2]float64 {
	t.Helper()
	return [2]float64{changedExternally(t, d, "IPv4"), changedExternally(t, d, "IPv6")}
}

// TestTableDeleted deletes the kube-proxy table by hand (one family, then `nft flush ruleset`, both): the
// watcher notices within its 2 s and the daemon writes the table again, as it was, within a few seconds,
// without waiting for the periodic sync (30 s here); each deletion is counted once, in its family; traffic
// flows again. Then, with a 3 s sync period, the table is deleted at several phases of the period, so that
// the watcher and the periodic check race to notice: still counted once each.
func TestTableDeleted(t *testing.T) {
	b := newBed(t, 2)
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	d := b.start("")
	before := normalized(b.waitSettled(t, []string{b.svcChain("service-", "web", "tcp")}))
	traffic := func(t *testing.T, label string) {
		t.Helper()
		for _, addr := range []string{harness.HostPort(web.Spec.ClusterIP, svcTCP), harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))} {
			harness.ExpectSpread(t, label+": client -> "+addr, harness.HitForTest(t, b.Topo.Client, "tcp", addr, 20, harness.HitOptions{}), harness.PodNames(1, 2), nil)
		}
	}
	traffic(t, "before")

	// Flushing the ruleset deletes both families' tables: one family's watcher asks for a full sync,
	// whose read-back of the other family's table races with that family's own watcher. It is done a
	// few times, each deletion to be counted once.
	for _, c := range []struct {
		name    string
		cmd     string
		times   int
		counted [2]float64
	}{
		{"DeleteTable", "delete table ip kube-proxy", 1, [2]float64{1, 0}},
		{"FlushRuleset", "flush ruleset", 4, [2]float64{1, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := counts(t, d)
			for range c.times {
				b.nft(t, c.cmd)
				took := b.waitTables(t, "after nft "+c.cmd, before, 8*time.Second)
				t.Logf("nft %s: the table was back as before after %v", c.cmd, took.Round(time.Millisecond))
				traffic(t, "after nft "+c.cmd)
			}
			time.Sleep(2500 * time.Millisecond) // a second count would come within a watch interval
			want := [2]float64{m[0] + c.counted[0]*float64(c.times), m[1] + c.counted[1]*float64(c.times)}
			if got := counts(t, d); got != want {
				t.Errorf("kubeproxy_nftables_changed_externally_total (IPv4, IPv6) went from %v to %v after %d× nft %s, want %v: "+
					"a deletion was counted twice (the log shows both the watcher and a sync's read-back noticing it)", m, got, c.times, c.cmd, want)
			}
		})
	}

	t.Run("DeleteAtEveryPhaseOfTheSyncPeriod", func(t *testing.T) {
		if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		d.WriteConfig(baseConfig + "nftables:\n  syncPeriod: 3s\n  minSyncPeriod: 0s\n")
		d.Start()
		b.waitTables(t, "after the restart", before, 10*time.Second)
		m := counts(t, d)
		last := time.Now()
		offsets := []time.Duration{300 * time.Millisecond, 1100 * time.Millisecond, 1900 * time.Millisecond, 2700 * time.Millisecond}
		for _, off := range offsets {
			time.Sleep(time.Until(last.Add(off)))
			b.nft(t, "delete table ip kube-proxy")
			took := b.waitTables(t, "after a deletion", before, 8*time.Second)
			last = time.Now()
			t.Logf("deleted %v after the last repair; back as before %v later", off, took.Round(time.Millisecond))
		}
		time.Sleep(3500 * time.Millisecond) // a periodic check and a watch interval
		if got := counts(t, d); got[0]-m[0] != float64(len(offsets)) || got[1] != m[1] {
			t.Errorf("kubeproxy_nftables_changed_externally_total went from %v to %v (IPv4, IPv6), want +%d IPv4", m, got, len(offsets))
		}
		traffic(t, "after the deletions")
	})
	if got := syncFailures(t, d); got != 0 {
		t.Errorf("%v sync failures", got)
	}
}

// TestTableChangedByHand removes one piece of the table by hand (a base chain, a Service's chain, a map
// element): the next periodic sync (3 s here) notices, counts it once and rewrites the table as it was,
// and traffic flows again.
func TestTableChangedByHand(t *testing.T) {
	b := newBed(t, 2)
	web := b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	plain := b.CreateService(t, "plain", nil)
	b.SetEndpoints(t, "plain", harness.ReadyEndpoint(2))
	const period = 3 * time.Second
	d := b.start("nftables:\n  syncPeriod: 3s\n  minSyncPeriod: 0s\n")
	plainChain := b.svcChain("service-", "plain", "tcp")
	before := normalized(b.waitSettled(t, []string{b.svcChain("service-", "web", "tcp"), plainChain}))
	element := func(ip string) string { return "service-ips { " + ip + " . tcp . " + fmt.Sprint(svcTCP) + " }" }

	m := counts(t, d)
	cases := []struct {
		name, cmd string
		svc       *corev1.Service
		pods      []int
	}{
		{"BaseChain", "delete chain ip kube-proxy nat-prerouting", web, []int{1, 2}},
		{"ServiceChain", "delete element ip kube-proxy " + element(plain.Spec.ClusterIP) + "; delete chain ip kube-proxy " + plainChain, plain, []int{2}},
		{"MapElement", "delete element ip kube-proxy " + element(web.Spec.ClusterIP), web, []int{1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := harness.HostPort(c.svc.Spec.ClusterIP, svcTCP)
			b.nft(t, c.cmd)
			// The change is real: the client's connections fail now.
			res := harness.HitForTest(t, b.Topo.Client, "tcp", addr, 1, harness.HitOptions{Timeout: 500 * time.Millisecond})
			if res[0].Err == "" {
				t.Errorf("after nft %s, %s still answered (%s)", c.cmd, addr, res[0].Pod)
			}
			took := b.waitTables(t, "after nft "+c.cmd, before, period+5*time.Second)
			t.Logf("nft %s: the table was back as before after %v", c.cmd, took.Round(time.Millisecond))
			harness.ExpectSpread(t, "after nft "+c.cmd, harness.HitForTest(t, b.Topo.Client, "tcp", addr, 20, harness.HitOptions{}), harness.PodNames(c.pods...), nil)
		})
	}
	time.Sleep(period) // the next periodic check finds nothing more to count
	if got := counts(t, d); got[0]-m[0] != float64(len(cases)) || got[1] != m[1] {
		t.Errorf("kubeproxy_nftables_changed_externally_total went from %v to %v (IPv4, IPv6), want +%d IPv4: one per change", m, got, len(cases))
	}
	if got := syncFailures(t, d); got != 0 {
		t.Errorf("%v sync failures", got)
	}
}

// EnvLong makes TestKillDuringFirstSync longer: more Services and three kills.
const EnvLong = "KP_NFT_LONG"

// TestKillDuringFirstSync kills the daemon with SIGKILL in the middle of its first sync of many Services
// (each nftables transaction is atomic, so the kill lands between two of the rebuild's transactions: the
// table holds the chains of some Services and none of the map elements yet), changes Services while it is
// down, and restarts it: the table must converge to exactly what an undisturbed daemon writes for the same
// Services (normalised listings equal), with no rule twice in a chain and no stale chain or set, and
// traffic must flow. With KP_NFT_LONG=1, 6,000 Services and three kills: early, half-way and late in the
// first sync.
func TestKillDuringFirstSync(t *testing.T) {
	n, points := 1500, []float64{0.5}
	if os.Getenv(EnvLong) != "" {
		n, points = 6000, []float64{0.01, 0.5, 0.9}
	}
	b := newBed(t, 2)
	web := b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	start := time.Now()
	manyServices(t, b, "svc", n)
	t.Logf("%d Services with 2 endpoints each created in %v", n, time.Since(start).Round(time.Millisecond))
	var d *harness.Daemon
	deleted := 0
	for round, point := range points {
		b.deleteTables(t)
		opts := harness.DaemonOptions{Config: baseConfig + syncConfig, NoWaitReady: true}
		if d == nil {
			d = b.startWith(opts)
		} else {
			d.Start()
		}
		chains, elems, ran := killAt(t, b, d, int(point*float64(n)))
		t.Logf("round %d: killed %v into the first sync, with %d of %d Service chains and %d service-ips elements written",
			round+1, ran.Round(time.Millisecond), chains, n+2, elems)

		// While it is down: 50 Services go (their chains may be written already), web changes.
		for i := deleted; i < deleted+50; i++ {
			b.DeleteService(t, fmt.Sprintf("svc-%04d", i))
		}
		deleted += 50
		b.SetEndpoints(t, "web", harness.ReadyEndpoint(1))
		start := time.Now()
		d.Start()
		d.WaitReady(2 * time.Minute)
		t.Logf("round %d: restarted, ready after %v", round+1, time.Since(start).Round(time.Millisecond))
		// The first sync flushed the deleted Services' chains; the next one after the stale-chain delay
		// deletes them (TestStaleChainsDeleted).
		time.Sleep(staleDelay)
		b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
		want := n - deleted + 2
		// The stale chains go a second after the first sync, on their own; web's second endpoint lands
		// with the sync of that change: wait for both.
		harness.Eventually(t, "the stale chains to go and web to reach both pods", time.Minute, func() (bool, string) {
			tab := b.table(t, "ip")
			got := 0
			for _, c := range tab.Names("chain") {
				if isServiceObject(c) {
					got++
				}
			}
			both := strings.Contains(tab.Normalized(), harness.PodIP(2)+" . 8080")
			return got == want && both, fmt.Sprintf("%d Service chains, want %d; web reaches pod 2: %v", got, want, both)
		})
		recovered := b.listings(t)
		expectConverged(t, fmt.Sprintf("round %d, after the restart", round+1), recovered)
		harness.ExpectSpread(t, "client -> web", harness.HitForTest(t, b.Topo.Client, "tcp", harness.HostPort(web.Spec.ClusterIP, svcTCP), 20, harness.HitOptions{}), harness.PodNames(1, 2), nil)

		// An undisturbed daemon, from no table at all, for the same Services.
		if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		b.deleteTables(t)
		d.Start()
		d.WaitReady(2 * time.Minute)
		compareTables(t, fmt.Sprintf("round %d: recovered after the kill, then undisturbed", round+1), recovered, b.listings(t))
		if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// deleteTables deletes both kube-proxy tables of the node namespace, if there.
func (b *bed) deleteTables(t testing.TB) {
	t.Helper()
	for _, tab := range b.tables(t) {
		if tab == "ip kube-proxy" || tab == "ip6 kube-proxy" {
			b.nft(t, "delete table "+tab)
		}
	}
}

// manyServices creates n ClusterIP Services "<prefix>-NNNN" with one TCP port and two endpoints each on
// another node (addresses in 10.247.0.0/16, never connected to), sixteen at a time.
func manyServices(t *testing.T, b *bed, prefix string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				errs <- createOne(ctx, b, fmt.Sprintf("%s-%04d", prefix, i), i)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// createOne creates the EndpointSlice, then the Service, of manyServices' Service i.
func createOne(ctx context.Context, b *bed, name string, i int) error {
	addr := func(k int) string { return fmt.Sprintf("10.247.%d.%d", (2*i+k)/250, (2*i+k)%250+1) }
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-slice", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("tcp"), Port: ptr[int32](podTCP), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for k := range 2 {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr(k)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(harness.OtherNode),
		})
	}
	if _, err := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating slice %s: %w", slice.Name, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{
			{Name: "tcp", Port: svcTCP, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(podTCP)}}},
	}
	if _, err := b.Cluster.Admin.CoreV1().Services(b.NS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Service %s: %w", name, err)
	}
	return nil
}

// killAt watches the node's table ip kube-proxy over netlink and kills the daemon with SIGKILL as soon as
// it holds at least threshold per-Service chains (at least one). It returns how many there were and how
// many elements service-ips held right after the kill, and how long the daemon had run. It fails t when
// the daemon finished its first sync (READY=1) before.
func killAt(t *testing.T, b *bed, d *harness.Daemon, threshold int) (chains, elems int, ran time.Duration) {
	t.Helper()
	started := time.Now()
	nsFile, err := os.Open(b.Topo.Node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nsFile.Close()
	conn, err := gnft.New(gnft.WithNetNSFd(int(nsFile.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		all, err := conn.ListChainsOfTableFamily(gnft.TableFamilyIPv4)
		if err != nil {
			return 0 // no table yet
		}
		n := 0
		for _, c := range all {
			if c.Table.Name == "kube-proxy" && isServiceObject(c.Name) {
				n++
			}
		}
		return n
	}
	ready := func() bool {
		for _, m := range d.Notify.Received() {
			if m.PID == d.Proc.PID() && strings.Contains("\n"+m.Text+"\n", "\nREADY=1\n") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if chains = count(); chains >= max(threshold, 1) {
			break
		}
		if ready() {
			t.Fatalf("the first sync finished (READY=1) before it wrote %d Service chains (%d): too few Services to catch it", threshold, chains)
		}
		if d.Proc.Exited() {
			t.Fatalf("the daemon exited on its own: %v\n%s", d.Proc.ExitErr(), d.Proc.LogTail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d Service chains within 2 minutes (%d)", threshold, chains)
		}
		time.Sleep(2 * time.Millisecond)
	}
	ran = time.Since(started)
	if err := d.Proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9: %v", err)
	}
	<-d.Proc.Done()
	if ready() {
		t.Fatalf("the first sync finished (READY=1) before the kill")
	}
	chains = count()
	tab := &gnft.Table{Name: "kube-proxy", Family: gnft.TableFamilyIPv4}
	if set, err := conn.GetSetByName(tab, "service-ips"); err == nil {
		if e, err := conn.GetSetElements(set); err == nil {
			elems = len(e)
		}
	}
	return chains, elems, ran
}
