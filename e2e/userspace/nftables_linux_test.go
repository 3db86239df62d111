package userspace

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// TestNFTablesLocalhostNodePorts: in mode nftables with the KubeProxyNFTablesLocalhostNodePorts gate on
// and localhost in nodePortAddresses (KEP-6032), the node's own TCP connections to 127.0.0.1:<nodePort>
// reach the Service's endpoints through the userspace proxy engine; UDP ones are still rejected and
// counted; the client's NodePort traffic goes through the kernel's rules as before. A Service with
// externalTrafficPolicy Local and no local endpoint has nothing listening on loopback.
func TestNFTablesLocalhostNodePorts(t *testing.T) {
	harness.Require(t, "nft")
	b := newBed(t, 2)
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	remote := b.CreateService(t, "remote", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	b.SetEndpoints(t, "remote", harness.RemoteEndpoint(2))
	d := harness.StartDaemon(t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
		NodeName: b.Node, Kubeconfig: b.Kubeconfig,
		Config: "mode: nftables\nclusterCIDR: " + harness.PodCIDR + "\nnftables:\n  minSyncPeriod: 0s\n" +
			"nodePortAddresses: [primary, localhost]\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n",
	})
	node, client := b.Topo.Node, b.Topo.Client
	tcp, udp := harness.NodePortOf(t, web, "tcp"), harness.NodePortOf(t, web, "udp")
	const n = 20

	// One listener on 127.0.0.1, for web's TCP port: remote has no local endpoint, UDP is not served.
	if v, ok := d.Metric(t, "kubeproxy_nftables_localhost_nodeport_listeners", `ip_family="IPv4"`); !ok || v != 1 {
		t.Errorf("kubeproxy_nftables_localhost_nodeport_listeners{ip_family=\"IPv4\"} = %v (exported %v), want 1", v, ok)
	}
	before, _ := d.Metric(t, "kubeproxy_userspace_connections_accepted_total", `protocol="TCP"`)
	harness.ExpectSpread(t, "node -> 127.0.0.1 tcp", harness.HitForTest(t, node, "tcp", harness.HostPort("127.0.0.1", tcp), n, harness.HitOptions{}),
		harness.PodNames(1, 2), harness.GatewayOf)
	if after, _ := d.Metric(t, "kubeproxy_userspace_connections_accepted_total", `protocol="TCP"`); after-before != n {
		t.Errorf("the localhost proxy accepted %v of %d connections", after-before, n)
	}
	rejected := func() float64 {
		v, _ := d.Metric(t, "kubeproxy_nftables_localhost_nodeport_rejected_packets_total", `ip_family="IPv4"`, `protocol="UDP"`)
		return v
	}
	r0 := rejected()
	harness.ExpectAllFail(t, "node -> 127.0.0.1 udp", harness.HitForTest(t, node, "udp", harness.HostPort("127.0.0.1", udp), 3, harness.HitOptions{Timeout: time.Second}), "refused")
	if r := rejected(); r-r0 < 3 {
		t.Errorf("rejected UDP localhost NodePort packets counted %v, want 3 more", r-r0)
	}
	harness.ExpectSpread(t, "client -> NodeIP tcp", harness.HitForTest(t, client, "tcp", harness.HostPort(harness.NodeIP, tcp), n, harness.HitOptions{}),
		harness.PodNames(1, 2), harness.GatewayOf)
	harness.ExpectAllFail(t, "node -> 127.0.0.1 Local policy, no local endpoint",
		harness.HitForTest(t, node, "tcp", harness.HostPort("127.0.0.1", harness.NodePortOf(t, remote, "tcp")), 3, harness.HitOptions{Timeout: time.Second}), "refused")
}
