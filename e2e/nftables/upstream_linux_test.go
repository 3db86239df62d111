package nftables

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/e2e/harness"
)

// Addresses outside every subnet of the bed, which the client reaches through its default route (the
// node): externalIPs and load balancer IPs.
const (
	externalIP   = "192.0.2.10"
	lbIP         = "192.0.2.20"
	externalIPv6 = "2001:db8::10"
	lbIPv6       = "2001:db8::20"
)

// otherConfig is a configuration with other rule shapes than baseConfig's: cluster IP traffic always
// masqueraded, pod traffic recognised by interface name, NodePorts on every local IPv4 address (and none
// on IPv6).
const otherConfig = "mode: nftables\nclusterCIDR: " + harness.PodCIDR + "\ndetectLocalMode: InterfaceNamePrefix\n" +
	"detectLocal:\n  interfaceNamePrefix: veth\nnodePortAddresses: [\"0.0.0.0/0\"]\n" +
	"nftables:\n  masqueradeAll: true\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n"

// TestUpstreamHandover runs upstream kube-proxy v1.37 in mode nftables, then ours, then upstream again,
// then ours again, and both once more with another configuration, in the same node namespace with traffic
// flowing all along (cluster IP, node port, externalIP and a load balancer IP behind
// loadBalancerSourceRanges): no connection may fail. At each handover without a change in between, both
// tables (ip and ip6 kube-proxy) must read the same, element order and the order of chain and set blocks
// aside. Our first sync also makes the chains of a Service deleted while nothing ran unused (they are
// deleted at the next sync).
func TestUpstreamHandover(t *testing.T) {
	b := newBed(t, 3)
	svcs := createHandoverServices(t, b)
	web := svcs["web"]
	upOpts := harness.UpstreamOptions{NodeName: b.Node, Config: baseConfig + syncConfig, Kubeconfig: b.Kubeconfig}
	targets := []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIP, svcTCP)},
		{Network: "udp", Addr: harness.HostPort(web.Spec.ClusterIP, svcUDP)},
		{Network: "tcp", Addr: harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))},
		{Network: "tcp", Addr: harness.HostPort(externalIP, svcTCP)},
		{Network: "tcp", Addr: harness.HostPort(lbIP, svcTCP)},
	}
	want := []string{b.svcChain("service-", "web", "tcp"), b.svcChain("firewall-", "local", "tcp"), b.svcChain("service-", "gone", "tcp")}

	// 1. Upstream.
	start := time.Now()
	up, upstream := b.upstreamSettled(t, upOpts, want)
	t.Logf("upstream kube-proxy settled %v after start", time.Since(start).Round(time.Millisecond))
	tr := harness.StartTraffic(b.Topo.Client, targets)
	tr.WaitFor(t, 100)

	// 2. Upstream -> ours: ours takes over upstream's table for the same Services.
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	tr.WaitMore(t, 100)
	d := b.start("")
	ours := b.waitSettled(t, want)
	compareTables(t, "upstream, then ours for the same Services", upstream, ours)
	tr.WaitMore(t, 100)

	// 3. Changes under ours: a Service deleted (its chains are flushed at once and deleted by the next sync
	// after the stale-chain delay: the changes that follow, TestStaleChainsDeleted has the case without
	// them), one created, endpoints changed.
	gone := []string{b.svcChain("service-", "gone", "tcp"), b.svcChain("service-", "gone", "udp")}
	deleted := time.Now()
	b.DeleteService(t, "gone")
	time.Sleep(staleDelay)
	b.CreateService(t, "new", nil)
	b.SetEndpoints(t, "new", harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	b.SetEndpoints(t, "sticky", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	b.waitChains(t, []string{b.svcChain("service-", "new", "tcp")}, gone)
	t.Logf("ours: the deleted Service's chains went %v after the deletion", time.Since(deleted).Round(time.Millisecond))
	ours = b.waitSettled(t, []string{b.svcChain("service-", "new", "tcp")})
	tr.WaitMore(t, 100)

	// 4. Ours -> upstream: upstream takes over our table for the same Services.
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	tr.WaitMore(t, 100)
	up, upstream = b.upstreamSettled(t, upOpts, []string{b.svcChain("service-", "new", "tcp")})
	compareTables(t, "ours, then upstream for the same Services", ours, upstream)
	tr.WaitMore(t, 100)
	// Upstream deletes a Service's chains too after a delay; how long it takes here, for comparison.
	deleted = time.Now()
	b.DeleteService(t, "new")
	b.waitChains(t, nil, []string{b.svcChain("service-", "new", "tcp")})
	t.Logf("upstream: the deleted Service's chains went %v after the deletion", time.Since(deleted).Round(time.Millisecond))

	// 5. Upstream -> ours, with a Service deleted while nothing runs: our first sync removes its chains.
	later := b.CreateService(t, "later", nil)
	b.SetEndpoints(t, "later", harness.ReadyEndpoint(1))
	laterChains := []string{b.svcChain("service-", "later", "tcp"), b.svcChain("service-", "later", "udp")}
	b.waitChains(t, laterChains, nil)
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	b.DeleteService(t, "later")
	tr.WaitMore(t, 100)
	d.Start()
	// After our first sync nothing refers to the deleted Service's chains, and they are empty; the next
	// sync after the stale-chain delay deletes them.
	tab := b.table(t, "ip")
	for _, blk := range tab.Blocks {
		if blk.Kind == "chain" && strings.Contains(blk.Name, b.NS+"/later/") && len(blk.Rules()) > 0 {
			t.Errorf("after our first sync, the deleted Service's chain %s still has rules: %q", blk.Name, blk.Rules())
		}
		for _, l := range slices.Concat(blk.Lines, blk.Elements) {
			if strings.Contains(l, b.NS+"/later/") || isElementOf(l, later.Spec.ClusterIP) {
				t.Errorf("after our first sync, %s still holds %s of the deleted Service", blk.Key(), l)
			}
		}
	}
	time.Sleep(staleDelay)
	b.SetEndpoints(t, "itp", harness.ReadyEndpoint(3), harness.ReadyEndpoint(2), harness.RemoteEndpoint(1)) // adds, flushes nothing
	b.waitChains(t, nil, laterChains)
	tr.WaitMore(t, 100)

	// 6. Another configuration, upstream then ours: the rule shapes of its options.
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	up, upstream = b.upstreamSettled(t, harness.UpstreamOptions{NodeName: b.Node, Config: otherConfig, Kubeconfig: b.Kubeconfig}, want[:2])
	tr.WaitMore(t, 100)
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	d.WriteConfig(otherConfig)
	d.Start()
	ours = b.waitSettled(t, want[:2])
	compareTables(t, "another configuration: upstream, then ours", upstream, ours)
	// The options did reach the rules.
	listing := ours["ip"].Normalized()
	for _, want := range []string{`comment "masquerade all clusterIP traffic"`, `iifname "veth*"`, "fib daddr type local"} {
		if !strings.Contains(listing, want) {
			t.Errorf("with the other configuration, table ip kube-proxy has no %s", want)
		}
	}
	tr.WaitMore(t, 100)
	harness.ExpectNoFailures(t, "across six handovers", tr.Stop())
	if got := syncFailures(t, d); got != 0 {
		t.Errorf("%v sync failures", got)
	}
	expectConverged(t, "after the last handover", b.listings(t))
}

// dualStackConfig is baseConfig for a dual-stack bed.
const dualStackConfig = "mode: nftables\nclusterCIDR: " + harness.PodCIDR + "," + harness.PodCIDRv6 + "\n" + syncConfig

// TestUpstreamHandoverDualStack is TestUpstreamHandover's first two handovers on a dual-stack node, with
// dual-stack Services (a cluster of its own): upstream, then ours, then upstream, with IPv4 and IPv6
// traffic flowing all along, no connection failing, and both tables reading the same at each handover.
func TestUpstreamHandoverDualStack(t *testing.T) {
	b := newBedWith(t, harness.BedOptions{Pods: 3, DualStack: true})
	svcs := createHandoverServices(t, b)
	web := svcs["web"]
	if len(web.Spec.ClusterIPs) != 2 {
		t.Fatalf("web's cluster IPs: %v, want one per family", web.Spec.ClusterIPs)
	}
	upOpts := harness.UpstreamOptions{NodeName: b.Node, Config: dualStackConfig, Kubeconfig: b.Kubeconfig}
	v6 := web.Spec.ClusterIPs[1]
	targets := []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIPs[0], svcTCP)},
		{Network: "tcp6", Addr: harness.HostPort(v6, svcTCP)},
		{Network: "udp6", Addr: harness.HostPort(v6, svcUDP)},
		{Network: "tcp6", Addr: harness.HostPort(harness.NodeIPv6, harness.NodePortOf(t, web, "tcp"))},
		{Network: "tcp6", Addr: harness.HostPort(externalIPv6, svcTCP)},
		{Network: "tcp6", Addr: harness.HostPort(lbIPv6, svcTCP)},
	}
	want := []string{b.svcChain("service-", "web", "tcp"), b.svcChain("firewall-", "local", "tcp")}

	up, upstream := b.upstreamSettled(t, upOpts, want)
	tr := harness.StartTraffic(b.Topo.Client, targets)
	tr.WaitFor(t, 100)
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	tr.WaitMore(t, 100)
	d := b.startWith(harness.DaemonOptions{Config: dualStackConfig})
	ours := b.waitSettled(t, want)
	compareTables(t, "dual-stack: upstream, then ours", upstream, ours)
	tr.WaitMore(t, 100)
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	tr.WaitMore(t, 100)
	_, upstream = b.upstreamSettled(t, upOpts, want)
	compareTables(t, "dual-stack: ours, then upstream", ours, upstream)
	tr.WaitMore(t, 100)
	harness.ExpectNoFailures(t, "dual-stack, across two handovers", tr.Stop())
}

// createHandoverServices creates Services that between them use every kind of chain, set and map element
// of the table, and returns them by name.
func createHandoverServices(t *testing.T, b *bed) map[string]*corev1.Service {
	t.Helper()
	out := map[string]*corev1.Service{}
	create := func(name string, mutate func(*corev1.Service), eps ...harness.Endpoint) {
		out[name] = b.CreateService(t, name, mutate)
		if eps != nil {
			b.SetEndpoints(t, name, eps...)
		}
	}
	ready, remote := harness.ReadyEndpoint, harness.RemoteEndpoint
	create("web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, ready(1), ready(2), ready(3))
	create("sticky", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}, ready(1), ready(2))
	create("local", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.LoadBalancerSourceRanges = []string{"10.250.0.0/24", "198.51.100.0/24"}
		if b.DualStack {
			s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, "fd00:10:250::/64", "2001:db8:100::/48")
		}
	}, ready(1), remote(2))
	create("remote", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, remote(2), remote(3))
	create("itp", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	}, ready(3), remote(1))
	create("extip", func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{externalIP}
		if b.DualStack {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, externalIPv6)
		}
	}, ready(2), ready(3))
	create("zonal", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferClose)
	},
		harness.Endpoint{Pod: 1, Ready: true, Serving: true, Zones: []string{harness.ZoneHere}},
		harness.Endpoint{Pod: 2, Node: harness.OtherNode, Ready: true, Serving: true, Zones: []string{harness.ZoneThere}})
	create("terminating", nil, harness.Endpoint{Pod: 1, Serving: true, Terminating: true}, harness.Endpoint{Pod: 2})
	create("empty", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	create("gone", nil, ready(1), ready(2))
	if b.DualStack {
		setLoadBalancerIPs(t, b, "local", lbIP, lbIPv6)
		setLoadBalancerIPs(t, b, "remote", "192.0.2.21", "2001:db8::21")
	} else {
		setLoadBalancerIPs(t, b, "local", lbIP)
		setLoadBalancerIPs(t, b, "remote", "192.0.2.21")
	}
	return out
}

// setLoadBalancerIPs writes load balancer ingress IPs into a Service's status, as a cloud controller would.
func setLoadBalancerIPs(t *testing.T, b *bed, name string, ips ...string) {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	api := b.Cluster.Admin.CoreV1().Services(b.NS)
	svc, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	if _, err := api.UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting the load balancer IP of %s: %v", name, err)
	}
}

// compareTables checks that two readings of both families' tables are the same, element order and the
// order of blocks aside (harness.NFTTable.Normalized), and shows every difference otherwise.
func compareTables(t *testing.T, label string, a, b map[string]*harness.NFTTable) {
	t.Helper()
	na, nb := normalized(a), normalized(b)
	for _, fam := range families {
		if na[fam] == "" || nb[fam] == "" {
			t.Errorf("%s: table %s kube-proxy missing (first %v, second %v)", label, fam, na[fam] != "", nb[fam] != "")
			continue
		}
		if na[fam] != nb[fam] {
			t.Errorf("%s: table %s kube-proxy differs (- first, + second):\n%s", label, fam, lineDiff(na[fam], nb[fam]))
		} else {
			t.Logf("%s: table %s kube-proxy the same (%d lines)", label, fam, strings.Count(na[fam], "\n"))
		}
	}
}
