package userspace

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// TestTraffic runs the traffic cases of mode userspace against one daemon: every connection is made from
// the client namespace, the node itself or a pod, captured by the daemon's rules and forwarded by its own
// proxy. The pods always see the node (its address on their veth) as the client: the userspace proxy
// opens its own connection to them.
func TestTraffic(t *testing.T) {
	b := newBed(t, 3)
	all := []int{1, 2, 3}
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	empty := b.CreateService(t, "empty", nil)
	sticky := b.CreateService(t, "sticky", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	b.SetEndpoints(t, "sticky", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	extip := b.CreateService(t, "extip", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{externalIP} })
	b.SetEndpoints(t, "extip", harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	b.CreateService(t, "lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"10.250.0.0/24"}
	})
	b.SetEndpoints(t, "lb", harness.ReadyEndpoint(1), harness.ReadyEndpoint(3))
	b.setLoadBalancerIP(t, "lb", lbIP)
	b.CreateService(t, "lbdeny", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
	})
	b.SetEndpoints(t, "lbdeny", harness.ReadyEndpoint(1))
	b.setLoadBalancerIP(t, "lbdeny", lbDenyIP)
	lbLocal := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	local := b.CreateService(t, "local", lbLocal)
	b.SetEndpoints(t, "local", harness.ReadyEndpoint(1), harness.RemoteEndpoint(2))
	remote := b.CreateService(t, "remote", lbLocal)
	b.SetEndpoints(t, "remote", harness.RemoteEndpoint(2), harness.RemoteEndpoint(3))
	cond := b.CreateService(t, "cond", nil)
	b.SetEndpoints(t, "cond",
		harness.ReadyEndpoint(1),
		harness.Endpoint{Pod: 2},                                   // not ready, not serving
		harness.Endpoint{Pod: 3, Serving: true, Terminating: true}) // serving but terminating
	// "dns": TCP and UDP on the same port number, as DNS has them.
	dns := b.CreateService(t, "dns", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(harness.PodTCPPort)},
			{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(harness.PodUDPPort)},
		}
	})
	b.SetEndpoints(t, "dns", harness.ReadyEndpoint(1), harness.ReadyEndpoint(3))
	// "half": three endpoints on port 9000, where only pods 1 and 2 listen; pod 3 refuses.
	const halfPort = 9000
	half := b.createPortService(t, "half", 90, halfPort)
	b.setPortEndpoints(t, "half", halfPort, 1, 2, 3)
	startLineServer(t, b, 1, halfPort, true)
	startLineServer(t, b, 2, halfPort, true)

	d := b.start("")
	client, node, pod1 := b.Topo.Client, b.Topo.Node, b.Topo.Pods[0].NS
	nodeSide := harness.GatewayOf // what every pod sees: the node's address on its veth
	const n = 30
	spread := func(t *testing.T, label string, from *harness.NetNS, network, addr string, pods ...int) {
		t.Helper()
		harness.ExpectSpread(t, label, harness.HitForTest(t, from, network, addr, n, harness.HitOptions{}), harness.PodNames(pods...), nodeSide)
	}

	t.Run("Rules", func(t *testing.T) {
		nat, filter := b.save(t, "nat"), b.save(t, "filter")
		for _, c := range natChains {
			if _, ok := nat.Chains[c]; !ok {
				t.Errorf("nat chain %s missing", c)
			}
		}
		for _, c := range filterChains {
			if _, ok := filter.Chains[c]; !ok {
				t.Errorf("filter chain %s missing", c)
			}
		}
		want := "-d " + web.Spec.ClusterIP + "/32 -p tcp -m tcp --dport 80"
		found := false
		for _, r := range nat.RulesOf("KUBE-PORTALS-CONTAINER") {
			found = found || (strings.Contains(r, want) && strings.Contains(r, "-j REDIRECT --to-ports "))
		}
		if !found {
			t.Errorf("KUBE-PORTALS-CONTAINER has no REDIRECT for %s:\n%s", want, strings.Join(nat.RulesOf("KUBE-PORTALS-CONTAINER"), "\n"))
		}
		for _, builtin := range []string{"PREROUTING", "OUTPUT"} {
			if rules := strings.Join(nat.RulesOf(builtin), "\n"); !strings.Contains(rules, "KUBE-PORTALS-") {
				t.Errorf("nat %s does not jump to our chains:\n%s", builtin, rules)
			}
		}
	})

	t.Run("ClusterIP", func(t *testing.T) {
		accepted := func() float64 {
			v, _ := d.Metric(t, "kubeproxy_userspace_connections_accepted_total", `protocol="TCP"`)
			return v
		}
		before := accepted()
		defer func() {
			// Every TCP connection above went through the daemon's own proxy.
			if got := accepted() - before; got != 3*n {
				t.Errorf("the userspace proxy accepted %v TCP connections, want %d", got, 3*n)
			}
		}()
		for _, network := range []string{"tcp", "udp"} {
			port := int32(svcTCP)
			if network == "udp" {
				port = svcUDP
			}
			addr := harness.HostPort(web.Spec.ClusterIP, port)
			spread(t, "client -> "+network+" "+addr, client, network, addr, all...)
			spread(t, "node -> "+network+" "+addr, node, network, addr, all...)
			spread(t, "pod1 -> "+network+" "+addr, pod1, network, addr, all...)
		}
	})

	t.Run("NodePort", func(t *testing.T) {
		tcp, udp := harness.NodePortOf(t, web, "tcp"), harness.NodePortOf(t, web, "udp")
		spread(t, "client -> NodeIP tcp", client, "tcp", harness.HostPort(harness.NodeIP, tcp), all...)
		spread(t, "client -> NodeIP udp", client, "udp", harness.HostPort(harness.NodeIP, udp), all...)
		spread(t, "node -> NodeIP tcp", node, "tcp", harness.HostPort(harness.NodeIP, tcp), all...)
		spread(t, "node -> 127.0.0.1 tcp", node, "tcp", harness.HostPort("127.0.0.1", tcp), all...)
		spread(t, "node -> 127.0.0.1 udp", node, "udp", harness.HostPort("127.0.0.1", udp), all...)
		spread(t, "pod1 -> NodeIP tcp", pod1, "tcp", harness.HostPort(harness.NodeIP, tcp), all...)
	})

	t.Run("ExternalIP", func(t *testing.T) {
		addr := harness.HostPort(externalIP, svcTCP)
		spread(t, "client -> externalIP tcp", client, "tcp", addr, 2, 3)
		spread(t, "client -> externalIP udp", client, "udp", harness.HostPort(externalIP, svcUDP), 2, 3)
		spread(t, "node -> externalIP tcp", node, "tcp", addr, 2, 3)
		_ = extip
	})

	t.Run("LoadBalancerIP", func(t *testing.T) {
		spread(t, "client (allowed source) -> LB IP tcp", client, "tcp", harness.HostPort(lbIP, svcTCP), 1, 3)
		spread(t, "client (allowed source) -> LB IP udp", client, "udp", harness.HostPort(lbIP, svcUDP), 1, 3)
		// loadBalancerSourceRanges that leave the client out: dropped (a timeout), as the other modes do.
		res := harness.HitForTest(t, client, "tcp", harness.HostPort(lbDenyIP, svcTCP), 3, harness.HitOptions{Timeout: time.Second})
		harness.ExpectAllFail(t, "client (source not allowed) -> LB IP", res, "timeout")
	})

	t.Run("UDPRequestResponse", func(t *testing.T) {
		// DNS-style: one socket asks several times; its flow keeps its endpoint while it is used, and
		// every answer comes from the Service address (the client's socket is connected to it, so an
		// answer from anywhere else would not arrive).
		flow := harness.NewUDPFlow(t, client, harness.HostPort(web.Spec.ClusterIP, svcUDP))
		first := flow.Ask()
		if first == "" {
			t.Fatal("no answer")
		}
		for range 5 {
			if got := flow.Ask(); got != first {
				t.Fatalf("UDP flow answered by %q, first by %s: want one flow, one endpoint", got, first)
			}
		}
		if v, ok := d.Metric(t, "kubeproxy_userspace_connections_accepted_total", `protocol="UDP"`); !ok || v == 0 {
			t.Errorf("kubeproxy_userspace_connections_accepted_total{protocol=UDP} = %v (found %v), want > 0", v, ok)
		}
	})

	t.Run("TCPAndUDPOnOnePort", func(t *testing.T) {
		addr := harness.HostPort(dns.Spec.ClusterIP, 53)
		spread(t, "client -> dns tcp/53", client, "tcp", addr, 1, 3)
		spread(t, "client -> dns udp/53", client, "udp", addr, 1, 3)
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		addr := harness.HostPort(sticky.Spec.ClusterIP, svcTCP)
		for _, from := range []*harness.NetNS{client, node} {
			res := harness.HitForTest(t, from, "tcp", addr, 20, harness.HitOptions{Concurrency: 1})
			counts := harness.CountHits(res)
			if len(counts) != 1 || counts["ERR:timeout"]+counts["ERR:refused"]+counts["ERR:other"] > 0 {
				t.Errorf("%s -> %s with ClientIP affinity: %s, want all 20 answered by one pod", from.Name, addr, harness.FormatHits(counts))
			}
		}
	})

	t.Run("NoEndpointsRejected", func(t *testing.T) {
		for _, c := range []struct {
			network string
			port    int32
		}{{"tcp", svcTCP}, {"udp", svcUDP}} {
			addr := harness.HostPort(empty.Spec.ClusterIP, c.port)
			res := harness.HitForTest(t, client, c.network, addr, 5, harness.HitOptions{Timeout: 2 * time.Second})
			harness.ExpectAllFail(t, "client -> "+c.network+" "+addr+" (no endpoints)", res, "refused")
		}
		harness.ExpectAllFail(t, "node -> empty tcp", harness.HitForTest(t, node, "tcp", harness.HostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
		harness.ExpectAllFail(t, "pod1 -> empty tcp", harness.HitForTest(t, pod1, "tcp", harness.HostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
	})

	t.Run("RefusingEndpointSkipped", func(t *testing.T) {
		before, _ := d.Metric(t, "kubeproxy_userspace_connections_failed_over_total", `protocol="TCP"`)
		addr := harness.HostPort(half.Spec.ClusterIP, 90)
		res := harness.HitForTest(t, client, "tcp", addr, 60, harness.HitOptions{})
		harness.ExpectNoFailures(t, "client -> half (pod3 refuses)", res)
		harness.ExpectSpread(t, "client -> half", res, harness.PodNames(1, 2), nodeSide)
		after, _ := d.Metric(t, "kubeproxy_userspace_connections_failed_over_total", `protocol="TCP"`)
		// Round-robin over three endpoints starts at the refusing one every third connection.
		if after-before < 15 {
			t.Errorf("failed over %v times for 60 connections, want about 20", after-before)
		}
		t.Logf("60 connections, 0 failed, %v failovers", after-before)
	})

	t.Run("EndpointConditions", func(t *testing.T) {
		// Ready pod 1 only: not-ready pod 2 and terminating pod 3 are not used while a ready one exists.
		spread(t, "client -> cond", client, "tcp", harness.HostPort(cond.Spec.ClusterIP, svcTCP), 1)
	})

	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
		np := harness.HostPort(harness.NodeIP, harness.NodePortOf(t, local, "tcp"))
		// From outside: the local endpoint only (it sees the node, not the client: a userspace proxy
		// cannot pass the client's address on).
		spread(t, "client -> local NodePort tcp", client, "tcp", np, 1)
		spread(t, "client -> local NodePort udp", client, "udp", harness.HostPort(harness.NodeIP, harness.NodePortOf(t, local, "udp")), 1)
		spread(t, "client -> local ClusterIP", client, "tcp", harness.HostPort(local.Spec.ClusterIP, svcTCP), 1, 2)
		// The node's own traffic to its NodePort goes to every endpoint, as upstream's rules send it.
		spread(t, "node -> local NodePort", node, "tcp", np, 1, 2)
		res := harness.HitForTest(t, client, "tcp", harness.HostPort(harness.NodeIP, harness.NodePortOf(t, remote, "tcp")), 3, harness.HitOptions{Timeout: time.Second})
		harness.ExpectAllFail(t, "client -> remote-only NodePort", res, "timeout")
		spread(t, "client -> remote-only ClusterIP", client, "tcp", harness.HostPort(remote.Spec.ClusterIP, svcTCP), 2, 3)
		harness.CheckHealthCheckNodePort(t, client, local, 200, 1)
		harness.CheckHealthCheckNodePort(t, client, remote, 503, 0)
	})
}
