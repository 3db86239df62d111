package iptables

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// TestTraffic runs the main traffic cases against our daemon once per iptables backend: real connections
// from the client namespace, the node itself and a pod, through the rules the daemon wrote.
func TestTraffic(t *testing.T) {
	for _, backend := range []string{harness.BackendNFT, harness.BackendLegacy} {
		t.Run(backend, func(t *testing.T) { trafficCases(t, backend) })
	}
}

func trafficCases(t *testing.T, backend string) {
	b := newBed(t, backend, 3)
	all := []int{1, 2, 3}
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	empty := b.CreateService(t, "empty", nil)
	sticky := b.CreateService(t, "sticky", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	b.SetEndpoints(t, "sticky", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	lbLocal := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	local := b.CreateService(t, "local", lbLocal)
	b.SetEndpoints(t, "local", harness.ReadyEndpoint(1), harness.RemoteEndpoint(2))
	remote := b.CreateService(t, "remote", lbLocal)
	b.SetEndpoints(t, "remote", harness.RemoteEndpoint(2), harness.RemoteEndpoint(3))
	zonal := b.CreateService(t, "zonal", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferClose)
	})
	b.SetEndpoints(t, "zonal",
		harness.Endpoint{Pod: 1, Ready: true, Serving: true, Zones: []string{harness.ZoneHere}},
		harness.Endpoint{Pod: 2, Node: harness.OtherNode, Ready: true, Serving: true, Zones: []string{harness.ZoneThere}},
		harness.Endpoint{Pod: 3, Ready: true, Serving: true, Zones: []string{harness.ZoneHere}})
	cond := b.CreateService(t, "cond", nil)
	b.SetEndpoints(t, "cond",
		harness.ReadyEndpoint(1),
		harness.Endpoint{Pod: 2},                                   // not ready, not serving
		harness.Endpoint{Pod: 3, Serving: true, Terminating: true}) // serving but terminating
	d := b.start("")
	// READY=1 comes after the first sync, which covers every object created before the start (the
	// informers sync first): the rules are there, in the backend the hint chose.
	b.waitChains(t, []string{b.svcChain("KUBE-SVC", "web", "tcp"), b.svcChain("KUBE-SVC", "web", "udp")}, nil)
	// The daemon took the backend the hint pointed at, said so, and left the other one alone.
	if v, ok := d.Metric(t, "kubeproxy_iptables_backend_info", `backend="`+backend+`"`, `ip_family="IPv4"`); !ok || v != 1 {
		t.Errorf("kubeproxy_iptables_backend_info{backend=%q} = %v (found %v), want 1", backend, v, ok)
	}
	other := harness.BackendLegacy
	if backend == harness.BackendLegacy {
		other = harness.BackendNFT
	}
	otherXT := &harness.XTables{NS: b.Topo.Node, Backend: other, LockFile: b.xt.LockFile}
	if chains := otherXT.KubeChains(t); len(chains) > 0 {
		t.Errorf("the %s backend holds our chains too: %v", other, chains)
	}

	client, node := b.Topo.Client, b.Topo.Node
	masqueraded := harness.GatewayOf
	const n = 30

	t.Run("ClusterIP", func(t *testing.T) { b.ExpectClusterIP(t, web, all...) })

	t.Run("NodePort", func(t *testing.T) {
		tcp, udp := harness.NodePortOf(t, web, "tcp"), harness.NodePortOf(t, web, "udp")
		harness.ExpectSpread(t, "client -> NodeIP tcp", harness.HitForTest(t, client, "tcp", harness.HostPort(harness.NodeIP, tcp), n, harness.HitOptions{}), harness.PodNames(all...), masqueraded)
		harness.ExpectSpread(t, "client -> NodeIP udp", harness.HitForTest(t, client, "udp", harness.HostPort(harness.NodeIP, udp), n, harness.HitOptions{}), harness.PodNames(all...), masqueraded)
		// localhostNodePorts (default true): the daemon set route_localnet in the node namespace.
		out, err := node.Run(context.Background(), "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
		if err != nil || strings.TrimSpace(out) != "1" {
			t.Errorf("route_localnet in the node namespace: %q %v, want 1", strings.TrimSpace(out), err)
		}
		// Each new connection to a NodePort on 127.0.0.1 is counted, as upstream counts it, in the nfacct
		// counter behind kubeproxy_iptables_localhost_nodeports_accepted_packets_total (nat sees a
		// connection's first packet only).
		const localhostMetric = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
		before, ok := d.Metric(t, localhostMetric)
		if !ok {
			t.Errorf("%s is not exported", localhostMetric)
		}
		res := harness.HitForTest(t, node, "tcp", harness.HostPort("127.0.0.1", tcp), n, harness.HitOptions{})
		harness.ExpectSpread(t, "node -> 127.0.0.1 tcp", res, harness.PodNames(all...), masqueraded)
		if after, _ := d.Metric(t, localhostMetric); after-before != n {
			t.Errorf("%s went from %v to %v over %d connections to 127.0.0.1:%d, want +%d", localhostMetric, before, after, n, tcp, n)
		}
		harness.ExpectSpread(t, "node -> NodeIP tcp", harness.HitForTest(t, node, "tcp", harness.HostPort(harness.NodeIP, tcp), n, harness.HitOptions{}), harness.PodNames(all...), masqueraded)
	})

	t.Run("NoEndpointsRejected", func(t *testing.T) {
		for _, c := range []struct {
			network string
			port    int32
		}{{"tcp", svcTCP}, {"udp", svcUDP}} {
			addr := harness.HostPort(empty.Spec.ClusterIP, c.port)
			start := time.Now()
			// A REJECT answers at once; with a 2 s timeout per attempt, anything that was dropped would
			// show up as "timeout", not "refused".
			res := harness.HitForTest(t, client, c.network, addr, 5, harness.HitOptions{Timeout: 2 * time.Second})
			harness.ExpectAllFail(t, "client -> "+c.network+" "+addr+" (no endpoints)", res, "refused")
			t.Logf("%s %s: 5 refusals in %v", c.network, addr, time.Since(start).Round(time.Millisecond))
		}
		// A pod's and the node's own connections are rejected too (filter FORWARD and OUTPUT).
		harness.ExpectAllFail(t, "pod1 -> empty tcp", harness.HitForTest(t, b.Topo.Pods[0].NS, "tcp", harness.HostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
		harness.ExpectAllFail(t, "node -> empty tcp", harness.HitForTest(t, node, "tcp", harness.HostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		addr := harness.HostPort(sticky.Spec.ClusterIP, svcTCP)
		// One at a time: the first connection records the client, the others must follow it.
		for _, from := range []*harness.NetNS{client, node} {
			res := harness.HitForTest(t, from, "tcp", addr, 20, harness.HitOptions{Concurrency: 1})
			counts := harness.CountHits(res)
			if len(counts) != 1 || counts["ERR:timeout"]+counts["ERR:refused"]+counts["ERR:other"] > 0 {
				t.Errorf("%s -> %s with ClientIP affinity: %s, want all 20 answered by one pod", from.Name, addr, harness.FormatHits(counts))
			}
		}
		// Its rules use the recent match, named after the endpoint chain, as upstream does.
		rules := strings.Join(b.save(t, "nat").RulesOf(b.svcChain("KUBE-SVC", "sticky", "tcp")), "\n")
		want := "-m recent --rcheck --seconds 10800 --reap --name " + b.sepChain("sticky", "tcp", 1)
		if !strings.Contains(rules, want) {
			t.Errorf("KUBE-SVC of sticky lacks %q:\n%s", want, rules)
		}
	})

	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) { b.ExpectExternalTrafficPolicyLocal(t, local, remote) })

	t.Run("TopologyHints", func(t *testing.T) {
		// Every endpoint has a zone hint and some are for our zone: only those are used.
		addr := harness.HostPort(zonal.Spec.ClusterIP, svcTCP)
		harness.ExpectSpread(t, "client -> zonal", harness.HitForTest(t, client, "tcp", addr, n, harness.HitOptions{}), harness.PodNames(1, 3), masqueraded)
	})

	t.Run("EndpointConditions", func(t *testing.T) {
		addr := harness.HostPort(cond.Spec.ClusterIP, svcTCP)
		harness.ExpectSpread(t, "client -> cond (ready pod1)", harness.HitForTest(t, client, "tcp", addr, 20, harness.HitOptions{}), harness.PodNames(1), nil)
		// Without ready endpoints, the serving terminating one takes the traffic.
		b.SetEndpoints(t, "cond", harness.Endpoint{Pod: 2}, harness.Endpoint{Pod: 3, Serving: true, Terminating: true})
		b.waitChains(t, []string{b.sepChain("cond", "tcp", 3)}, []string{b.sepChain("cond", "tcp", 1)})
		harness.ExpectSpread(t, "client -> cond (terminating pod3)", harness.HitForTest(t, client, "tcp", addr, 20, harness.HitOptions{}), harness.PodNames(3), nil)
	})

	t.Run("RestartWithoutFailedRequest", func(t *testing.T) {
		d.ExpectRestartWithoutFailure(t, client, []harness.Target{
			{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIP, svcTCP)},
			{Network: "udp", Addr: harness.HostPort(web.Spec.ClusterIP, svcUDP)},
			{Network: "tcp", Addr: harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))},
		})
	})

	t.Run("EndpointRemoval", func(t *testing.T) {
		b.ExpectUDPFlowFollowsRemoval(t, web, all, func(gone int) {
			b.waitChains(t, nil, []string{b.sepChain("web", "tcp", gone), b.sepChain("web", "udp", gone)})
		})
	})

	t.Run("ServiceDeletion", func(t *testing.T) {
		var chains []string
		for _, port := range []string{"tcp", "udp"} {
			chains = append(chains, b.svcChain("KUBE-SVC", "web", port), b.svcChain("KUBE-EXT", "web", port))
			for _, i := range all {
				chains = append(chains, b.sepChain("web", port, i))
			}
		}
		b.DeleteService(t, "web")
		harness.Eventually(t, "web's rules to go", 30*time.Second, func() (bool, string) {
			for _, table := range []string{"nat", "filter"} {
				tab := b.save(t, table)
				for _, c := range chains {
					if _, ok := tab.Chains[c]; ok {
						return false, table + " still has " + c
					}
				}
				for _, r := range tab.Rules {
					if strings.Contains(r, b.NS+"/web:") {
						return false, table + " still has " + r
					}
				}
			}
			return true, ""
		})
	})

	if t.Failed() {
		t.Logf("nat table:\n%s", strings.Join(b.save(t, "nat").Rules, "\n"))
	}
}
