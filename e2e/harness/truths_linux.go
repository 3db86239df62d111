package harness

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The checks below are what every proxy mode must make true of a Bed's Services, whatever its rules
// look like: each mode's suite calls them on its own daemon.

// ExpectClusterIP checks a Service's cluster IP (WebPorts): from the client and from the node, TCP
// connections and UDP exchanges (one datagram each way) are answered by every pod in pods, masqueraded
// (the pod sees the node's address on its link); from pod 1, inside the cluster CIDR, they are not
// masqueraded, except when pod 1 reaches itself (hairpin).
func (b *Bed) ExpectClusterIP(t testing.TB, svc *corev1.Service, pods ...int) {
	t.Helper()
	const n = 30
	for _, network := range []string{"tcp", "udp"} {
		port := int32(ServiceTCPPort)
		if network == "udp" {
			port = ServiceUDPPort
		}
		addr := HostPort(svc.Spec.ClusterIP, port)
		for _, from := range []*NetNS{b.Topo.Client, b.Topo.Node} {
			ExpectSpread(t, from.Name+" -> "+network+" "+addr, HitForTest(t, from, network, addr, n, HitOptions{}), PodNames(pods...), GatewayOf)
		}
	}
	pod1 := b.Topo.Pods[0]
	addr := HostPort(svc.Spec.ClusterIP, ServiceTCPPort)
	ExpectSpread(t, "pod1 -> "+addr, HitForTest(t, pod1.NS, "tcp", addr, n, HitOptions{}), PodNames(pods...), func(p string) string {
		if p == "pod1" {
			return pod1.Gateway
		}
		return pod1.IP
	})
}

// ExpectExternalTrafficPolicyLocal checks two LoadBalancer Services with externalTrafficPolicy Local
// (WebPorts): local, with endpoints pod 1 on this node and pod 2 on another, and remote, with pods 2 and
// 3 on another. From the client, local's node ports reach pod 1 only, which sees the client's own
// address; its cluster IP reaches both, masqueraded, and so does the node's own traffic to its node port.
// remote's node port drops the client's traffic (a timeout), its cluster IP works. The health check node
// ports answer 200 with one local endpoint and 503 with none, in upstream's JSON.
func (b *Bed) ExpectExternalTrafficPolicyLocal(t testing.TB, local, remote *corev1.Service) {
	t.Helper()
	const n = 30
	client, node := b.Topo.Client, b.Topo.Node
	fromClient := func(string) string { return ClientIP }
	np := HostPort(NodeIP, NodePortOf(t, local, "tcp"))
	ExpectSpread(t, "client -> local NodePort tcp", HitForTest(t, client, "tcp", np, n, HitOptions{}), PodNames(1), fromClient)
	ExpectSpread(t, "client -> local NodePort udp", HitForTest(t, client, "udp", HostPort(NodeIP, NodePortOf(t, local, "udp")), n, HitOptions{}), PodNames(1), fromClient)
	ExpectSpread(t, "client -> local ClusterIP", HitForTest(t, client, "tcp", HostPort(local.Spec.ClusterIP, ServiceTCPPort), n, HitOptions{}), PodNames(1, 2), GatewayOf)
	ExpectSpread(t, "node -> local NodePort", HitForTest(t, node, "tcp", np, n, HitOptions{}), PodNames(1, 2), GatewayOf)
	res := HitForTest(t, client, "tcp", HostPort(NodeIP, NodePortOf(t, remote, "tcp")), 3, HitOptions{Timeout: time.Second})
	ExpectAllFail(t, "client -> remote-only NodePort", res, "timeout")
	ExpectSpread(t, "client -> remote-only ClusterIP", HitForTest(t, client, "tcp", HostPort(remote.Spec.ClusterIP, ServiceTCPPort), n, HitOptions{}), PodNames(2, 3), GatewayOf)
	CheckHealthCheckNodePort(t, client, local, 200, 1)
	CheckHealthCheckNodePort(t, client, remote, 503, 0)
}

// ExpectUDPFlowFollowsRemoval opens a UDP "flow" from the client to svc's cluster IP (one socket, so one
// conntrack entry, pinned to whichever of pods answers first), removes that pod from the Service's
// endpoints, calls removed (nil: nothing) with it, and checks that new connections reach the other pods
// only and that the flow moves to one of them: the removed pod still runs its server, so only the proxy's
// conntrack cleanup can move it. It returns the removed pod.
func (b *Bed) ExpectUDPFlowFollowsRemoval(t testing.TB, svc *corev1.Service, pods []int, removed func(pod int)) int {
	t.Helper()
	udp := NewUDPFlow(t, b.Topo.Client, HostPort(svc.Spec.ClusterIP, ServiceUDPPort))
	first := udp.Ask()
	if first == "" {
		t.Fatalf("no answer on the UDP flow")
	}
	if again := udp.Ask(); again != first {
		t.Fatalf("UDP flow moved from %s to %s without a change", first, again)
	}
	gone, _ := strconv.Atoi(strings.TrimPrefix(first, "pod"))
	var keep []Endpoint
	var kept []int
	for _, i := range pods {
		if i != gone {
			keep = append(keep, ReadyEndpoint(i))
			kept = append(kept, i)
		}
	}
	b.SetEndpoints(t, svc.Name, keep...)
	if removed != nil {
		removed(gone)
	}
	addr := HostPort(svc.Spec.ClusterIP, ServiceTCPPort)
	// 30 connections, not 10: before the sync, 10 random picks of 3 pods miss the removed one 1.7 % of
	// the time, and the check below would then meet it (a flake seen in CI); 30 miss it 0.0005 % of the time.
	Eventually(t, "connections to reach the remaining pods only", 10*time.Second, func() (bool, string) {
		counts := CountHits(HitForTest(t, b.Topo.Client, "tcp", addr, 30, HitOptions{}))
		return counts[first] == 0, FormatHits(counts)
	})
	ExpectSpread(t, "client -> "+svc.Name+" after removing "+first, HitForTest(t, b.Topo.Client, "tcp", addr, 30, HitOptions{}), PodNames(kept...), GatewayOf)
	Eventually(t, "the UDP flow to leave "+first, 10*time.Second, func() (bool, string) {
		got := udp.Ask()
		return got != first && got != "", "answered by " + got
	})
	return gone
}

// ExpectRestartWithoutFailure keeps connections going from ns to targets while the daemon is stopped
// (SIGTERM), runs without it for a while, and is started again: the rules stay in place while no daemon
// runs, and the new one's first sync rewrites them without a gap, so no connection may fail.
func (d *Daemon) ExpectRestartWithoutFailure(t testing.TB, from *NetNS, targets []Target) {
	t.Helper()
	tr := StartTraffic(from, targets)
	defer tr.Stop()
	tr.WaitFor(t, 60)
	stopped := time.Now()
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	tr.WaitMore(t, 60) // traffic carries on with no daemon at all
	d.Start()
	t.Logf("restarted: ready %v after the stop", time.Since(stopped).Round(time.Millisecond))
	tr.WaitMore(t, 120) // and through the restarted daemon's first sync and beyond
	ExpectNoFailures(t, "across the restart", tr.Stop())
}
