package userspace

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// TestDualStack: on a dual-stack node both families get listeners and capture rules (ip6tables too), and
// IPv6 TCP and UDP reach the pods through the userspace proxy, from the client and from the node.
func TestDualStack(t *testing.T) {
	b := newBedWith(t, harness.BedOptions{Pods: 2, DualStack: true})
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	d := harness.StartDaemon(t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
		NodeName: b.Node, Env: []string{b.xt.Env()}, Kubeconfig: b.Kubeconfig,
		Config: strings.Replace(baseConfig, harness.PodCIDR, harness.PodCIDR+","+harness.PodCIDRv6, 1),
	})
	defer func() {
		if t.Failed() {
			t.Logf("kube-proxy log:\n%s", d.Proc.LogTail(60))
		}
	}()
	if len(web.Spec.ClusterIPs) != 2 {
		t.Fatalf("ClusterIPs %v: want one per family", web.Spec.ClusterIPs)
	}
	v6 := web.Spec.ClusterIPs[1]
	seen := func(pod string) string {
		i, _ := strconv.Atoi(strings.TrimPrefix(pod, "pod"))
		return harness.PodGatewayIPv6(i)
	}
	const n = 20
	for _, from := range []*harness.NetNS{b.Topo.Client, b.Topo.Node} {
		harness.ExpectSpread(t, from.Name+" -> ["+v6+"] tcp", harness.HitForTest(t, from, "tcp6", harness.HostPort(v6, svcTCP), n, harness.HitOptions{}), harness.PodNames(1, 2), seen)
		harness.ExpectSpread(t, from.Name+" -> ["+v6+"] udp", harness.HitForTest(t, from, "udp6", harness.HostPort(v6, svcUDP), n, harness.HitOptions{}), harness.PodNames(1, 2), seen)
	}
	harness.ExpectSpread(t, "client -> NodeIPv6 NodePort tcp", harness.HitForTest(t, b.Topo.Client, "tcp6",
		harness.HostPort(harness.NodeIPv6, harness.NodePortOf(t, web, "tcp")), n, harness.HitOptions{}), harness.PodNames(1, 2), seen)
	harness.ExpectSpread(t, "client -> IPv4 tcp", harness.HitForTest(t, b.Topo.Client, "tcp4", harness.HostPort(web.Spec.ClusterIPs[0], svcTCP), n, harness.HitOptions{}), harness.PodNames(1, 2), harness.GatewayOf)
	if v, ok := d.Metric(t, "kubeproxy_userspace_listeners", `protocol="UDP"`); !ok || v != 2 {
		t.Errorf("UDP listeners %v (found %v), want 2: one per family", v, ok)
	}
}
