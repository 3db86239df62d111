package twonodes

import (
	"context"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// The pods of the bed: pod 1 and 2 on node A (the bed's node), pod 101 and 102 on node B.
const (
	podA1, podA2 = 1, 2
	podB1, podB2 = harness.NodeBPodBase + 1, harness.NodeBPodBase + 2
)

// modeConfig is each mode's daemon configuration: pods are in PodCIDR (so traffic from outside it is
// masqueraded), partial syncs at once, a full one every 30 s.
var modeConfig = map[string]string{
	"iptables": "mode: iptables\nclusterCIDR: " + harness.PodCIDR + "\niptables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n",
	"nftables": "mode: nftables\nclusterCIDR: " + harness.PodCIDR + "\nnftables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n",
}

// modeTools are the commands each mode's test needs besides ip and sysctl.
var modeTools = map[string][]string{
	"iptables": {"iptables-nft", "iptables-nft-save"},
	"nftables": {"nft"},
}

// TestTwoNodes runs the two-node cases in mode iptables and mode nftables, side by side: each mode has a
// bed of its own (two nodes, their pods, a client) and runs our daemon on both nodes.
func TestTwoNodes(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			twoNodeCases(t, mode)
		})
	}
}

func twoNodeCases(t *testing.T, mode string) {
	started := time.Now()
	b := newTwoNodes(t, mode)
	// Every Service exists before the daemons start: READY=1 comes after a first sync that covers them.
	cross := b.CreateService(t, "cross", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "cross", harness.ReadyEndpoint(podB1))
	local := b.CreateService(t, "local", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	b.SetEndpoints(t, "local", harness.ReadyEndpoint(podA1))
	itp := b.CreateService(t, "itp", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	})
	b.SetEndpoints(t, "itp", harness.ReadyEndpoint(podA1), harness.ReadyEndpoint(podB1))
	b.startDaemons(t)
	t.Logf("two nodes up, both daemons ready, in %v", time.Since(started).Round(time.Millisecond))
	defer func() {
		if t.Failed() {
			b.logRules(t)
		}
	}()

	t.Run("NodePortToOtherNode", func(t *testing.T) { b.nodePortToOtherNode(t, cross) })
	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) { b.externalTrafficPolicyLocal(t, local) })
	t.Run("InternalTrafficPolicyLocal", func(t *testing.T) { b.internalTrafficPolicyLocal(t, itp) })
	t.Logf("%s: %v in all", mode, time.Since(started).Round(time.Millisecond))
}

// nodePortToOtherNode checks a NodePort Service (externalTrafficPolicy Cluster) whose only endpoint is on
// node B. Through node A's NodePort the client reaches it, and the pod sees node A's address: node A
// masqueraded the connection, so the pod's answer goes back through node A, which undoes both
// translations (unmasqueraded, node B would hand the answer to the client directly, from an address the
// client never called, and the connection would fail). Through node B's own NodePort the pod sees node B's
// address on its link; and a pod on node A reaches it through the cluster IP, unmasqueraded.
func (b *twoNodes) nodePortToOtherNode(t *testing.T, svc *corev1.Service) {
	const n = 20
	client := b.Topo.Client
	seen := func(addr string) func(string) string { return func(string) string { return addr } }
	for _, network := range []string{"tcp", "udp"} {
		addr := harness.HostPort(harness.NodeIP, harness.NodePortOf(t, svc, network))
		harness.ExpectSpread(t, "client -> node A NodePort "+network, hit(t, client, network, addr, n), harness.PodNames(podB1), seen(harness.NodeIP))
	}
	addr := harness.HostPort(harness.NodeBIP, harness.NodePortOf(t, svc, "tcp"))
	harness.ExpectSpread(t, "client -> node B NodePort", hit(t, client, "tcp", addr, n), harness.PodNames(podB1), seen(harness.PodGatewayIP(podB1)))
	addr = harness.HostPort(svc.Spec.ClusterIP, harness.ServiceTCPPort)
	harness.ExpectSpread(t, "pod1 on A -> cluster IP", hit(t, b.pod(podA1), "tcp", addr, n), harness.PodNames(podB1), seen(harness.PodIP(podA1)))
}

// externalTrafficPolicyLocal checks a LoadBalancer Service with externalTrafficPolicy Local whose only
// endpoint is pod 1 on node A. Its health check node port answers 200 with one local endpoint on node A and
// 503 with none on node B, in upstream's JSON. The client reaches it through node A's NodePort, keeping its
// own address, while node B drops the client's connections to its NodePort (no answer, no rejection). Pods
// and the node itself are not outside traffic: a pod on node B reaching node B's NodePort is sent to pod 1
// on node A unmasqueraded, and node B's own connections masqueraded, as upstream's "short-circuit pod
// traffic" and "short-circuit local traffic" rules do.
func (b *twoNodes) externalTrafficPolicyLocal(t *testing.T, svc *corev1.Service) {
	const n = 20
	client := b.Topo.Client
	harness.CheckHealthCheckNodePortAt(t, client, harness.NodeIP, svc, 200, 1)
	harness.CheckHealthCheckNodePortAt(t, client, harness.NodeBIP, svc, 503, 0)
	port := harness.NodePortOf(t, svc, "tcp")
	harness.ExpectSpread(t, "client -> node A NodePort", hit(t, client, "tcp", harness.HostPort(harness.NodeIP, port), n),
		harness.PodNames(podA1), func(string) string { return harness.ClientIP })
	expectDropped(t, "client -> node B NodePort", client, harness.HostPort(harness.NodeBIP, port))
	harness.ExpectSpread(t, "pod101 on B -> node B NodePort", hit(t, b.pod(podB1), "tcp", harness.HostPort(harness.NodeBIP, port), n),
		harness.PodNames(podA1), func(string) string { return harness.PodIP(podB1) })
	harness.ExpectSpread(t, "node B -> node B NodePort", hit(t, b.Topo.NodeB, "tcp", harness.HostPort(harness.NodeBIP, port), n),
		harness.PodNames(podA1), func(string) string { return harness.NodeBIP })
}

// internalTrafficPolicyLocal checks a ClusterIP Service with internalTrafficPolicy Local and one endpoint on
// each node: each node's pods, and each node itself, reach only their own node's endpoint. With node B's
// endpoint removed, node B's pods and node B get no service at all (dropped, as upstream drops traffic to
// a Service with endpoints but none local), while node A's still reach pod 1.
func (b *twoNodes) internalTrafficPolicyLocal(t *testing.T, svc *corev1.Service) {
	const n = 20
	addr := harness.HostPort(svc.Spec.ClusterIP, harness.ServiceTCPPort)
	onA, onB := b.pod(podA2), b.pod(podB2)
	fromPod := func(pod int) func(string) string { return func(string) string { return harness.PodIP(pod) } }
	checkA := func(when string) {
		harness.ExpectSpread(t, "pod2 on A -> cluster IP"+when, hit(t, onA, "tcp", addr, n), harness.PodNames(podA1), fromPod(podA2))
		harness.ExpectSpread(t, "node A -> cluster IP"+when, hit(t, b.Topo.Node, "tcp", addr, n), harness.PodNames(podA1), nil)
	}
	checkA("")
	harness.ExpectSpread(t, "pod102 on B -> cluster IP", hit(t, onB, "tcp", addr, n), harness.PodNames(podB1), fromPod(podB2))
	harness.ExpectSpread(t, "node B -> cluster IP", hit(t, b.Topo.NodeB, "tcp", addr, n), harness.PodNames(podB1), nil)

	b.SetEndpoints(t, svc.Name, harness.ReadyEndpoint(podA1))
	harness.Eventually(t, "node B to stop serving the cluster IP", 10*time.Second, func() (bool, string) {
		counts := harness.CountHits(harness.HitForTest(t, onB, "tcp", addr, 4, harness.HitOptions{Timeout: 300 * time.Millisecond}))
		return counts["pod"+strconv.Itoa(podB1)] == 0, harness.FormatHits(counts)
	})
	expectDropped(t, "pod102 on B -> cluster IP without a local endpoint", onB, addr)
	expectDropped(t, "node B -> cluster IP without a local endpoint", b.Topo.NodeB, addr)
	checkA(" after the removal")
}

// expectDropped checks that three connections from ns to addr all time out (1 s each, at once): dropped,
// where a rejection would show as "refused" at once.
func expectDropped(t *testing.T, label string, from *harness.NetNS, addr string) {
	t.Helper()
	res := harness.HitForTest(t, from, "tcp", addr, 3, harness.HitOptions{Timeout: time.Second})
	harness.ExpectAllFail(t, label+" (dropped)", res, "timeout")
}

// hit makes n TCP connections or UDP exchanges from ns to addr (2 s timeout each).
func hit(t *testing.T, from *harness.NetNS, network, addr string, n int) []harness.HitResult {
	t.Helper()
	return harness.HitForTest(t, from, network, addr, n, harness.HitOptions{})
}

// twoNodes is one mode's world: a two-node bed and our daemon on each node.
type twoNodes struct {
	*harness.Bed
	mode string
	// xt are the iptables tools of node A and node B (mode iptables), each with a lock file of its own.
	xt []*harness.XTables
}

// newTwoNodes builds a two-node bed with two pods per node; in mode iptables it creates the
// KUBE-IPTABLES-HINT chain of the nft backend on both nodes, so that both daemons use iptables-nft.
func newTwoNodes(t *testing.T, mode string) *twoNodes {
	t.Helper()
	b := &twoNodes{mode: mode, Bed: harness.NewBed(t, harness.BedOptions{
		Pods: 2, NodeBPods: 2, Prefix: "two-" + mode[:3], Tools: modeTools[mode]})}
	if mode != "iptables" {
		return b
	}
	ctx, cancel := b.Ctx()
	defer cancel()
	for _, ns := range []*harness.NetNS{b.Topo.Node, b.Topo.NodeB} {
		xt, err := harness.NewXTables(ns, harness.BackendNFT, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := xt.SetHint(ctx); err != nil {
			t.Fatal(err)
		}
		b.xt = append(b.xt, xt)
	}
	return b
}

// startDaemons starts our daemon on node A (hostnameOverride the bed's Node) and on node B (NodeB), both
// at once, and waits for each one's READY=1.
func (b *twoNodes) startDaemons(t *testing.T) {
	t.Helper()
	start := func(ns *harness.NetNS, node, kubeconfig string, i int) *harness.Daemon {
		opts := harness.DaemonOptions{NodeName: node, Kubeconfig: kubeconfig, Config: modeConfig[b.mode], NoWaitReady: true}
		if b.xt != nil {
			opts.Env = []string{b.xt[i].Env()}
		}
		return harness.StartDaemon(t, b.Cluster, ns, opts)
	}
	started := time.Now()
	a := start(b.Topo.Node, b.Node, b.Kubeconfig, 0)
	nb := start(b.Topo.NodeB, b.NodeB, b.KubeconfigB, 1)
	a.WaitReady(time.Minute)
	nb.WaitReady(time.Minute)
	t.Logf("kube-proxy (%s) on both nodes ready %v after start", b.mode, time.Since(started).Round(time.Millisecond))
}

// logRules logs both nodes' rules: iptables-save, or table ip kube-proxy.
func (b *twoNodes) logRules(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, ns := range []*harness.NetNS{b.Topo.Node, b.Topo.NodeB} {
		var out string
		var err error
		if b.xt != nil {
			out, err = b.xt[i].Save(ctx, false, "")
		} else {
			out, err = ns.NFT(ctx, "list", "table", "ip", "kube-proxy")
		}
		t.Logf("rules of node %c (%v):\n%s", 'A'+i, err, out)
	}
}

// pod returns pod i's namespace (node A's pods from 1, node B's from NodeBPodBase+1).
func (b *twoNodes) pod(i int) *harness.NetNS { return b.Topo.PodByName("pod" + strconv.Itoa(i)).NS }

func ptr[T any](v T) *T { return &v }
