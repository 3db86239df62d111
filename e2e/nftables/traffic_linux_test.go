package nftables

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// TestTraffic runs the main traffic cases against our daemon in mode nftables: real connections from the
// client namespace (outside the node), the node itself and a pod, through the table the daemon wrote, and
// then through endpoint churn, a restart, live reloads and a Service's deletion.
func TestTraffic(t *testing.T) {
	b := newBed(t, 3)
	all := []int{1, 2, 3}
	nodePort := func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }
	web := b.CreateService(t, "web", nodePort)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	empty := b.CreateService(t, "empty", nodePort)
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
	flow := b.CreateService(t, "flow", nil)
	b.SetEndpoints(t, "flow", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	churn := b.CreateService(t, "churn", nil)
	b.SetEndpoints(t, "churn", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	d := b.start("")
	// READY=1 comes after the first sync, which covers every object created before the start (the
	// informers sync first).
	b.waitChains(t, []string{b.svcChain("service-", "web", "tcp"), b.svcChain("service-", "web", "udp")}, nil)

	client, node := b.Topo.Client, b.Topo.Node
	masqueraded := harness.GatewayOf
	const n = 30
	hit := func(t *testing.T, from *harness.NetNS, network, addr string, n int) []harness.HitResult {
		t.Helper()
		return harness.HitForTest(t, from, network, addr, n, harness.HitOptions{})
	}

	// TCP connections and UDP request/response exchanges (one datagram each way, as DNS does).
	t.Run("ClusterIP", func(t *testing.T) { b.ExpectClusterIP(t, web, all...) })

	t.Run("NodePort", func(t *testing.T) {
		tcp, udp := harness.NodePortOf(t, web, "tcp"), harness.NodePortOf(t, web, "udp")
		harness.ExpectSpread(t, "client -> NodeIP tcp", hit(t, client, "tcp", harness.HostPort(harness.NodeIP, tcp), n), harness.PodNames(all...), masqueraded)
		harness.ExpectSpread(t, "client -> NodeIP udp", hit(t, client, "udp", harness.HostPort(harness.NodeIP, udp), n), harness.PodNames(all...), masqueraded)
		harness.ExpectSpread(t, "node -> NodeIP tcp", hit(t, node, "tcp", harness.HostPort(harness.NodeIP, tcp), n), harness.PodNames(all...), masqueraded)
		// nodePortAddresses defaults to the primary address in mode nftables: as upstream, loopback
		// NodePorts are not served (nothing listens there, so the node refuses).
		harness.ExpectAllFail(t, "node -> 127.0.0.1 tcp", harness.HitForTest(t, node, "tcp", harness.HostPort("127.0.0.1", tcp), 3, harness.HitOptions{}), "refused")
	})

	t.Run("NoEndpointsRejected", func(t *testing.T) {
		for _, c := range []struct {
			network string
			addr    string
		}{
			{"tcp", harness.HostPort(empty.Spec.ClusterIP, svcTCP)},
			{"udp", harness.HostPort(empty.Spec.ClusterIP, svcUDP)},
			{"tcp", harness.HostPort(harness.NodeIP, harness.NodePortOf(t, empty, "tcp"))},
			{"udp", harness.HostPort(harness.NodeIP, harness.NodePortOf(t, empty, "udp"))},
		} {
			start := time.Now()
			// A reject answers at once; with a 2 s timeout per attempt, anything that was dropped would
			// show up as "timeout", not "refused".
			res := harness.HitForTest(t, client, c.network, c.addr, 5, harness.HitOptions{Timeout: 2 * time.Second})
			harness.ExpectAllFail(t, "client -> "+c.network+" "+c.addr+" (no endpoints)", res, "refused")
			t.Logf("%s %s: 5 refusals in %v", c.network, c.addr, time.Since(start).Round(time.Millisecond))
		}
		// A pod's and the node's own connections are rejected too (filter-forward and filter-output).
		addr := harness.HostPort(empty.Spec.ClusterIP, svcTCP)
		harness.ExpectAllFail(t, "pod1 -> empty tcp", hit(t, b.Topo.Pods[0].NS, "tcp", addr, 3), "refused")
		harness.ExpectAllFail(t, "node -> empty tcp", hit(t, node, "tcp", addr, 3), "refused")
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		addr := harness.HostPort(sticky.Spec.ClusterIP, svcTCP)
		// One at a time: the first connection records the client, the others must follow it.
		for _, from := range []*harness.NetNS{client, node} {
			res := harness.HitForTest(t, from, "tcp", addr, 20, harness.HitOptions{Concurrency: 1})
			counts := harness.CountHits(res)
			if len(counts) != 1 || res[0].Err != "" {
				t.Errorf("%s -> %s with ClientIP affinity: %s, want all 20 answered by one pod", from.Name, addr, harness.FormatHits(counts))
				continue
			}
			// The client's address is in the affinity set of that endpoint, and of no other.
			pod, _ := strconv.Atoi(strings.TrimPrefix(res[0].Pod, "pod"))
			tab := b.table(t, "ip")
			for _, i := range all {
				set := tab.Block("set", b.endpointChain("affinity-", "sticky", "tcp", i))
				if set == nil {
					t.Fatalf("no affinity set of pod%d", i)
				}
				has := slices.ContainsFunc(set.Elements, func(e string) bool { return isElementOf(e, harness.ClientIP) })
				if from == client && has != (i == pod) {
					t.Errorf("affinity set of pod%d holds the client: %v, want %v (elements %q)", i, has, i == pod, set.Elements)
				}
			}
		}
	})

	// Outside traffic to a node port stays on the node; the health check node ports say so.
	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) { b.ExpectExternalTrafficPolicyLocal(t, local, remote) })

	t.Run("UDPFlowFollowsEndpointRemoval", func(t *testing.T) { b.ExpectUDPFlowFollowsRemoval(t, flow, all, nil) })

	t.Run("EndpointChurn", func(t *testing.T) {
		endpointChurn(t, b, churn)
	})

	targets := []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIP, svcTCP)},
		{Network: "udp", Addr: harness.HostPort(web.Spec.ClusterIP, svcUDP)},
		{Network: "tcp", Addr: harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))},
	}

	t.Run("RestartWithoutFailedRequest", func(t *testing.T) {
		d.ExpectRestartWithoutFailure(t, client, targets)
		if got := syncFailures(t, d); got != 0 {
			t.Errorf("%v sync failures after the restart", got)
		}
	})

	t.Run("ReloadWithoutFailedRequest", func(t *testing.T) {
		bin, err := harness.DaemonBinary()
		if err != nil {
			t.Fatal(err)
		}
		reload := func(t *testing.T) {
			t.Helper()
			cmd := exec.Command(bin, "reload", strconv.Itoa(d.Proc.PID()))
			cmd.Env = append(os.Environ(), "RUNTIME_DIRECTORY="+d.RuntimeDir)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			t.Logf("kube-proxy reload (%v): %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
			if err != nil {
				t.Fatalf("kube-proxy reload: %v", err)
			}
		}
		masqAll := "masquerade all clusterIP traffic"
		tr := harness.StartTraffic(client, targets)
		tr.WaitFor(t, 60)
		// nftables.masqueradeAll changes the rules: the services chain marks all cluster IP traffic. The helper
		// returns once the new configuration is in force.
		d.WriteConfig(baseConfig + syncConfig + "  masqueradeAll: true\n")
		reload(t)
		if !b.chainHas(t, "services", masqAll) {
			t.Errorf("after the reload the services chain lacks %q", masqAll)
		}
		tr.WaitMore(t, 120)
		// A pod's own traffic is masqueraded now (the reload is in force for traffic too).
		pod1 := b.Topo.Pods[0]
		harness.ExpectSpread(t, "pod1 -> web with masqueradeAll", hit(t, pod1.NS, "tcp", harness.HostPort(web.Spec.ClusterIP, svcTCP), n),
			harness.PodNames(all...), masqueraded)
		d.WriteConfig(baseConfig + syncConfig)
		reload(t)
		if b.chainHas(t, "services", masqAll) {
			t.Errorf("after the second reload the services chain still has %q", masqAll)
		}
		tr.WaitMore(t, 120)
		harness.ExpectNoFailures(t, "across two reloads", tr.Stop())
		if v, _ := d.Metric(t, "kubeproxy_config_reloads_total", `result="applied"`); v != 2 {
			t.Errorf("kubeproxy_config_reloads_total{result=\"applied\"} = %v, want 2", v)
		}
	})

	t.Run("ServiceDeletion", func(t *testing.T) {
		var chains []string
		for _, port := range []string{"tcp", "udp"} {
			chains = append(chains, b.svcChain("service-", "web", port), b.svcChain("external-", "web", port))
		}
		b.waitChains(t, chains, nil)
		deleted := time.Now()
		b.DeleteService(t, "web")
		// The Service's map elements go at once: its cluster IP is then unallocated (dropped), and its node
		// port is nobody's (the node refuses).
		harness.Eventually(t, "web to stop answering", 10*time.Second, func() (bool, string) {
			res := harness.HitForTest(t, client, "tcp", harness.HostPort(web.Spec.ClusterIP, svcTCP), 1, harness.HitOptions{Timeout: 500 * time.Millisecond})
			return res[0].Err == "timeout", harness.FormatHits(harness.CountHits(res))
		})
		t.Logf("web stopped answering %v after the deletion", time.Since(deleted).Round(time.Millisecond))
		harness.ExpectAllFail(t, "client -> deleted web's node port", harness.HitForTest(t, client, "tcp",
			harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp")), 3, harness.HitOptions{}), "refused")
		// The chains are flushed at once and deleted by the next sync after the stale-chain delay: here the
		// one an endpoint change makes (TestStaleChainsDeleted has the case without one).
		time.Sleep(time.Until(deleted.Add(staleDelay)))
		b.SetEndpoints(t, "flow", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
		harness.Eventually(t, "web's chains to go", staleDeadline, func() (bool, string) {
			tab := b.table(t, "ip")
			if ok, why := chainsAre(tab, nil, chains); !ok {
				return false, why
			}
			for _, blk := range tab.Blocks {
				if strings.Contains(blk.Name, b.NS+"/web/") {
					return false, blk.Key() + " still there"
				}
				for _, l := range slices.Concat(blk.Lines, blk.Elements) {
					if strings.Contains(l, b.NS+"/web/") || isElementOf(l, web.Spec.ClusterIP) {
						return false, blk.Key() + " still has " + l
					}
				}
			}
			return true, ""
		})
		t.Logf("web's chains gone %v after the deletion", time.Since(deleted).Round(time.Millisecond))
	})

	if t.Failed() {
		t.Logf("table ip kube-proxy:\n%s", b.nft(t, "list", "table", "ip", "kube-proxy"))
	}
}

// endpointChurn removes and adds endpoints of Service svc while TCP and UDP traffic flows to it. Pod 1
// stays an endpoint throughout; pods 2 and 3 leave and come back. A pod removed from the Service is cut
// off (its namespace drops everything coming in) once the rules no longer name it and no UDP conntrack
// entry leads to it any more, so a connection still sent its way fails.
//
// TCP: no connection may fail. UDP: each pod counts the requests it receives and the answers it sends
// (nftables counters in the pod's own namespace, ahead of the cut), which accounts for every request:
// none may be lost on the way to a pod, none may reach a pod while it is cut off, and no answer of pod 1
// may be lost. An answer of a pod being removed can be lost: the daemon deletes the conntrack entries of
// a removed UDP endpoint, and an exchange in flight at that moment loses its way back (upstream does the
// same); those are logged.
func endpointChurn(t *testing.T, b *bed, svc *corev1.Service) {
	client := b.Topo.Client
	tcpAddr, udpAddr := harness.HostPort(svc.Spec.ClusterIP, svcTCP), harness.HostPort(svc.Spec.ClusterIP, svcUDP)
	podNFT := func(pod int, cmds string) string {
		t.Helper()
		ctx, cancel := b.Ctx()
		defer cancel()
		out, err := b.Topo.Pods[pod-1].NS.NFT(ctx, cmds)
		if err != nil {
			t.Fatalf("pod%d: %v", pod, err)
		}
		return out
	}
	// The counters see a request before the cut can drop it, and an answer as it leaves.
	for i := 1; i <= 3; i++ {
		podNFT(i, "add table inet churn-count; add counter inet churn-count rx; add counter inet churn-count tx; "+
			"add chain inet churn-count in { type filter hook input priority -300; }; "+
			"add chain inet churn-count out { type filter hook output priority 300; }; "+
			"add rule inet churn-count in udp dport "+strconv.Itoa(podUDP)+" counter name rx; "+
			"add rule inet churn-count out udp sport "+strconv.Itoa(podUDP)+" counter name tx")
	}
	t.Cleanup(func() {
		for i := 1; i <= 3; i++ {
			ctx, cancel := b.Ctx()
			_, _ = b.Topo.Pods[i-1].NS.NFT(ctx, "delete table inet churn-count")
			_, _ = b.Topo.Pods[i-1].NS.NFT(ctx, "delete table inet cut")
			cancel()
		}
	})
	counter := func(pod int, name string) int {
		out := podNFT(pod, "list counter inet churn-count "+name)
		f := strings.Fields(out[strings.Index(out, "packets"):])
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("pod%d counter %s: %q", pod, name, out)
		}
		return n
	}
	chains := []string{b.svcChain("service-", svc.Name, "tcp"), b.svcChain("service-", svc.Name, "udp")}
	// waitRules waits until pod is an endpoint in both of the Service's chains (want true) or in neither
	// (want false).
	waitRules := func(pod int, want bool) {
		t.Helper()
		harness.Eventually(t, "the rules to follow the endpoints", 15*time.Second, func() (bool, string) {
			for _, c := range chains {
				if (b.chainHas(t, c, harness.PodIP(pod)+" ") || b.chainHas(t, c, harness.PodIP(pod)+":")) != want {
					return false, c + " not updated for pod" + strconv.Itoa(pod)
				}
			}
			return true, ""
		})
	}
	current := map[int]bool{1: true, 2: true, 3: true}
	apply := func() []int {
		t.Helper()
		var pods []int
		var eps []harness.Endpoint
		for i := 1; i <= 3; i++ {
			if current[i] {
				pods = append(pods, i)
				eps = append(eps, harness.ReadyEndpoint(i))
			}
		}
		b.SetEndpoints(t, svc.Name, eps...)
		return pods
	}

	tcpTr := harness.StartTraffic(client, []harness.Target{{Network: "tcp", Addr: tcpAddr}})
	udpTr := harness.StartTraffic(client, []harness.Target{{Network: "udp", Addr: udpAddr}})
	tr := tcpTr
	tr.WaitFor(t, 40)
	// udpFlowsTo counts the node's UDP conntrack entries of the Service whose replies come from pod p:
	// until the sync that removed p has deleted them (its conntrack cleanup follows the rules, 0.1 to
	// 0.4 s later here under load), a request from a client port used before follows its entry to p.
	udpFlowsTo := func(p int) int {
		t.Helper()
		ctx, cancel := b.Ctx()
		defer cancel()
		out, err := b.Topo.Node.Run(ctx, "conntrack", "-L", "-p", "udp", "--orig-dst", svc.Spec.ClusterIP, "--reply-src", harness.PodIP(p))
		if err != nil {
			t.Fatal(err)
		}
		_, summary, _ := strings.Cut(out, "(conntrack-tools): ")
		n, err := strconv.Atoi(strings.Fields(summary + " x")[0])
		if err != nil {
			t.Fatalf("conntrack -L: %q", out)
		}
		return n
	}
	remove := func(p int) {
		t.Helper()
		delete(current, p)
		keep := apply()
		waitRules(p, false)
		harness.Eventually(t, "the conntrack cleanup", 10*time.Second, func() (bool, string) {
			n := udpFlowsTo(p)
			return n == 0, strconv.Itoa(n) + " UDP conntrack entries still lead to pod" + strconv.Itoa(p)
		})
		time.Sleep(300 * time.Millisecond) // connections made just before the change finish
		podNFT(p, "add table inet cut; add chain inet cut in { type filter hook input priority 0; policy drop; }")
		tr.WaitMore(t, 40)
		harness.ExpectSpread(t, "after removing pod"+strconv.Itoa(p), harness.HitForTest(t, client, "tcp", tcpAddr, 20, harness.HitOptions{}), harness.PodNames(keep...), nil)
	}
	add := func(p int) {
		t.Helper()
		podNFT(p, "delete table inet cut")
		current[p] = true
		pods := apply()
		waitRules(p, true)
		tr.WaitMore(t, 40)
		harness.ExpectSpread(t, "after adding pod"+strconv.Itoa(p), harness.HitForTest(t, client, "tcp", tcpAddr, 30, harness.HitOptions{}), harness.PodNames(pods...), nil)
	}
	remove(2)
	remove(3)
	add(2)
	add(3)
	remove(3)
	add(3)
	tcp, udp := tcpTr.Stop(), udpTr.Stop()
	answered := map[string]int{}
	for _, r := range udp {
		answered[r.Pod]++
	}
	harness.ExpectNoFailures(t, "TCP during endpoint churn", tcp)
	received := 0
	for i := 1; i <= 3; i++ {
		rx, tx := counter(i, "rx"), counter(i, "tx")
		received += rx
		lost := tx - answered["pod"+strconv.Itoa(i)]
		t.Logf("pod%d: %d UDP requests received, %d answered, %d answers reached the client", i, rx, tx, answered["pod"+strconv.Itoa(i)])
		if rx != tx {
			t.Errorf("pod%d received %d UDP requests while cut off from the Service", i, rx-tx)
		}
		switch {
		case lost != 0 && i == 1:
			t.Errorf("%d answers of pod1, an endpoint throughout, did not reach the client", lost)
		case lost != 0:
			t.Logf("%d answers of pod%d were lost: in flight when its removal deleted its conntrack entries", lost, i)
		}
	}
	if received != len(udp) {
		t.Errorf("%d UDP requests sent, %d reached a pod", len(udp), received)
	}
}
