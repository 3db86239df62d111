package iptables

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	web := b.createService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.setEndpoints(t, "web", readyEP(1), readyEP(2), readyEP(3))
	empty := b.createService(t, "empty", nil)
	sticky := b.createService(t, "sticky", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	b.setEndpoints(t, "sticky", readyEP(1), readyEP(2), readyEP(3))
	lbLocal := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	local := b.createService(t, "local", lbLocal)
	b.setEndpoints(t, "local", readyEP(1), remoteEP(2))
	remote := b.createService(t, "remote", lbLocal)
	b.setEndpoints(t, "remote", remoteEP(2), remoteEP(3))
	zonal := b.createService(t, "zonal", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferClose)
	})
	b.setEndpoints(t, "zonal",
		ep{pod: 1, ready: true, serving: true, zones: []string{zoneHere}},
		ep{pod: 2, node: otherNode, ready: true, serving: true, zones: []string{zoneThere}},
		ep{pod: 3, ready: true, serving: true, zones: []string{zoneHere}})
	cond := b.createService(t, "cond", nil)
	b.setEndpoints(t, "cond",
		readyEP(1),
		ep{pod: 2}, // not ready, not serving
		ep{pod: 3, serving: true, terminating: true}) // serving but terminating
	d := b.start("")
	// READY=1 comes after the first sync, which covers every object created before the start (the
	// informers sync first): the rules are there, in the backend the hint chose.
	b.waitChains(t, []string{b.svcChain("KUBE-SVC", "web", "tcp"), b.svcChain("KUBE-SVC", "web", "udp")}, nil)
	// The daemon took the backend the hint pointed at, said so, and left the other one alone.
	if v, ok := metric(metrics(t, d), "kubeproxy_iptables_backend_info", `backend="`+backend+`"`, `ip_family="IPv4"`); !ok || v != 1 {
		t.Errorf("kubeproxy_iptables_backend_info{backend=%q} = %v (found %v), want 1", backend, v, ok)
	}
	other := harness.BackendLegacy
	if backend == harness.BackendLegacy {
		other = harness.BackendNFT
	}
	otherXT := &harness.XTables{NS: b.topo.Node, Backend: other, LockFile: b.xt.LockFile}
	if chains := kubeChains(t, otherXT); len(chains) > 0 {
		t.Errorf("the %s backend holds our chains too: %v", other, chains)
	}

	client, node := b.topo.Client, b.topo.Node
	masqueraded := gatewayOf
	fromClient := func(string) string { return harness.ClientIP }
	const n = 30

	t.Run("ClusterIP", func(t *testing.T) {
		for _, network := range []string{"tcp", "udp"} {
			port := int32(svcTCP)
			if network == "udp" {
				port = svcUDP
			}
			addr := hostPort(web.Spec.ClusterIP, port)
			expectSpread(t, "client -> "+network+" "+addr, hit(t, client, network, addr, n, harness.HitOptions{}), podNames(all...), masqueraded)
			expectSpread(t, "node -> "+network+" "+addr, hit(t, node, network, addr, n, harness.HitOptions{}), podNames(all...), masqueraded)
		}
		// From a pod (inside clusterCIDR): not masqueraded, except when the pod reaches itself (hairpin).
		pod1 := b.topo.Pods[0]
		addr := hostPort(web.Spec.ClusterIP, svcTCP)
		expectSpread(t, "pod1 -> "+addr, hit(t, pod1.NS, "tcp", addr, n, harness.HitOptions{}), podNames(all...), func(p string) string {
			if p == "pod1" {
				return pod1.Gateway
			}
			return pod1.IP
		})
	})

	t.Run("NodePort", func(t *testing.T) {
		tcp, udp := nodePort(t, web, "tcp"), nodePort(t, web, "udp")
		expectSpread(t, "client -> NodeIP tcp", hit(t, client, "tcp", hostPort(harness.NodeIP, tcp), n, harness.HitOptions{}), podNames(all...), masqueraded)
		expectSpread(t, "client -> NodeIP udp", hit(t, client, "udp", hostPort(harness.NodeIP, udp), n, harness.HitOptions{}), podNames(all...), masqueraded)
		// localhostNodePorts (default true): the daemon set route_localnet in the node namespace.
		out, err := node.Run(context.Background(), "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
		if err != nil || strings.TrimSpace(out) != "1" {
			t.Errorf("route_localnet in the node namespace: %q %v, want 1", strings.TrimSpace(out), err)
		}
		expectSpread(t, "node -> 127.0.0.1 tcp", hit(t, node, "tcp", hostPort("127.0.0.1", tcp), n, harness.HitOptions{}), podNames(all...), masqueraded)
		expectSpread(t, "node -> NodeIP tcp", hit(t, node, "tcp", hostPort(harness.NodeIP, tcp), n, harness.HitOptions{}), podNames(all...), masqueraded)
	})

	t.Run("NoEndpointsRejected", func(t *testing.T) {
		for _, c := range []struct {
			network string
			port    int32
		}{{"tcp", svcTCP}, {"udp", svcUDP}} {
			addr := hostPort(empty.Spec.ClusterIP, c.port)
			start := time.Now()
			// A REJECT answers at once; with a 2 s timeout per attempt, anything that was dropped would
			// show up as "timeout", not "refused".
			res := hit(t, client, c.network, addr, 5, harness.HitOptions{Timeout: 2 * time.Second})
			expectAllErr(t, "client -> "+c.network+" "+addr+" (no endpoints)", res, "refused")
			t.Logf("%s %s: 5 refusals in %v", c.network, addr, time.Since(start).Round(time.Millisecond))
		}
		// A pod's and the node's own connections are rejected too (filter FORWARD and OUTPUT).
		expectAllErr(t, "pod1 -> empty tcp", hit(t, b.topo.Pods[0].NS, "tcp", hostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
		expectAllErr(t, "node -> empty tcp", hit(t, node, "tcp", hostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		addr := hostPort(sticky.Spec.ClusterIP, svcTCP)
		// One at a time: the first connection records the client, the others must follow it.
		for _, from := range []*harness.NetNS{client, node} {
			res := hit(t, from, "tcp", addr, 20, harness.HitOptions{Concurrency: 1})
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

	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
		// Only the local endpoint, and it sees the client's own address (no SNAT).
		np := nodePort(t, local, "tcp")
		expectSpread(t, "client -> local NodePort tcp", hit(t, client, "tcp", hostPort(harness.NodeIP, np), n, harness.HitOptions{}), podNames(1), fromClient)
		expectSpread(t, "client -> local NodePort udp", hit(t, client, "udp", hostPort(harness.NodeIP, nodePort(t, local, "udp")), n, harness.HitOptions{}), podNames(1), fromClient)
		// Its cluster IP still uses every endpoint (internalTrafficPolicy Cluster), masqueraded.
		expectSpread(t, "client -> local ClusterIP", hit(t, client, "tcp", hostPort(local.Spec.ClusterIP, svcTCP), n, harness.HitOptions{}), podNames(1, 2), masqueraded)
		// The node's own traffic to the NodePort goes to every endpoint, like traffic through a load balancer.
		expectSpread(t, "node -> local NodePort", hit(t, node, "tcp", hostPort(harness.NodeIP, np), n, harness.HitOptions{}), podNames(1, 2), masqueraded)
		// No local endpoint: upstream DROPs external traffic, so the client times out.
		res := hit(t, client, "tcp", hostPort(harness.NodeIP, nodePort(t, remote, "tcp")), 3, harness.HitOptions{Timeout: time.Second})
		expectAllErr(t, "client -> remote-only NodePort", res, "timeout")
		expectSpread(t, "client -> remote-only ClusterIP", hit(t, client, "tcp", hostPort(remote.Spec.ClusterIP, svcTCP), n, harness.HitOptions{}), podNames(2, 3), masqueraded)

		// Health check node ports, from outside.
		checkHealth(t, client, local, 200, 1)
		checkHealth(t, client, remote, 503, 0)
	})

	t.Run("TopologyHints", func(t *testing.T) {
		// Every endpoint has a zone hint and some are for our zone: only those are used.
		addr := hostPort(zonal.Spec.ClusterIP, svcTCP)
		expectSpread(t, "client -> zonal", hit(t, client, "tcp", addr, n, harness.HitOptions{}), podNames(1, 3), masqueraded)
	})

	t.Run("EndpointConditions", func(t *testing.T) {
		addr := hostPort(cond.Spec.ClusterIP, svcTCP)
		expectSpread(t, "client -> cond (ready pod1)", hit(t, client, "tcp", addr, 20, harness.HitOptions{}), podNames(1), nil)
		// Without ready endpoints, the serving terminating one takes the traffic.
		b.setEndpoints(t, "cond", ep{pod: 2}, ep{pod: 3, serving: true, terminating: true})
		b.waitChains(t, []string{b.sepChain("cond", "tcp", 3)}, []string{b.sepChain("cond", "tcp", 1)})
		expectSpread(t, "client -> cond (terminating pod3)", hit(t, client, "tcp", addr, 20, harness.HitOptions{}), podNames(3), nil)
	})

	t.Run("RestartWithoutFailedRequest", func(t *testing.T) {
		tr := startTraffic(client, []target{
			{"tcp", hostPort(web.Spec.ClusterIP, svcTCP)},
			{"udp", hostPort(web.Spec.ClusterIP, svcUDP)},
			{"tcp", hostPort(harness.NodeIP, nodePort(t, web, "tcp"))},
		})
		tr.waitFor(t, 60)
		stopped := time.Now()
		if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		tr.waitFor(t, tr.count()+60) // traffic carries on with no daemon at all
		d.Start()
		t.Logf("restarted: ready %v after the stop", time.Since(stopped).Round(time.Millisecond))
		tr.waitFor(t, tr.count()+120) // and through the restarted daemon's first (full) sync and beyond
		res := tr.stop()
		fails := 0
		for _, r := range res {
			if r.Err != "" {
				fails++
			}
		}
		t.Logf("%d connections across the restart, %d failed", len(res), fails)
		if fails > 0 {
			t.Errorf("%d of %d connections failed across the restart: %s", fails, len(res), harness.FormatHits(harness.CountHits(res)))
		}
	})

	t.Run("EndpointRemoval", func(t *testing.T) {
		// A UDP "flow": one client socket, so one conntrack entry, pinned to whichever pod answers first.
		udp := newUDPFlow(t, client, hostPort(web.Spec.ClusterIP, svcUDP))
		first := udp.ask(t)
		if first == "" {
			t.Fatalf("no answer on the UDP flow")
		}
		if again := udp.ask(t); again != first {
			t.Fatalf("UDP flow moved from %s to %s without a change", first, again)
		}
		gone, _ := strconv.Atoi(strings.TrimPrefix(first, "pod"))
		var keep []ep
		var keepNames []int
		for _, i := range all {
			if i != gone {
				keep = append(keep, readyEP(i))
				keepNames = append(keepNames, i)
			}
		}
		b.setEndpoints(t, "web", keep...)
		b.waitChains(t, nil, []string{b.sepChain("web", "tcp", gone), b.sepChain("web", "udp", gone)})
		addr := hostPort(web.Spec.ClusterIP, svcTCP)
		expectSpread(t, "client -> web after removing "+first, hit(t, client, "tcp", addr, n, harness.HitOptions{}), podNames(keepNames...), masqueraded)
		// The removed pod still runs its server, so only the conntrack cleanup moves the flow elsewhere.
		eventually(t, "the UDP flow to leave "+first, 10*time.Second, func() (bool, string) {
			got := udp.ask(t)
			return got != first && got != "", "answered by " + got
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
		b.deleteService(t, "web")
		eventually(t, "web's rules to go", 30*time.Second, func() (bool, string) {
			for _, table := range []string{"nat", "filter"} {
				tab := b.save(t, table)
				for _, c := range chains {
					if _, ok := tab.Chains[c]; ok {
						return false, table + " still has " + c
					}
				}
				for _, r := range tab.Rules {
					if strings.Contains(r, b.ns+"/web:") {
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

// checkHealth fetches a Service's health check node port from ns (through the node's primary address) and
// checks the status, upstream's JSON body and the endpoint-weight header.
func checkHealth(t *testing.T, from *harness.NetNS, svc *corev1.Service, wantCode, wantLocal int) {
	t.Helper()
	port := svc.Spec.HealthCheckNodePort
	if port == 0 {
		t.Fatalf("Service %s has no health check node port", svc.Name)
	}
	url := "http://" + hostPort(harness.NodeIP, port) + "/"
	var code int
	var body, weight string
	eventually(t, "health check of "+svc.Name, 15*time.Second, func() (bool, string) {
		resp, err := from.HTTPClient().Get(url)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		code, body, weight = resp.StatusCode, string(b), resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
		return code == wantCode, "status " + strconv.Itoa(code)
	})
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"" + svc.Namespace + "\",\n\t\t\"name\": \"" + svc.Name +
		"\"\n\t},\n\t\"localEndpoints\": " + strconv.Itoa(wantLocal) + ",\n\t\"serviceProxyHealthy\": true\n}"
	if body != want {
		t.Errorf("health check of %s: body\n%s\nwant\n%s", svc.Name, body, want)
	}
	if weight != strconv.Itoa(wantLocal) {
		t.Errorf("health check of %s: X-Load-Balancing-Endpoint-Weight %q, want %d", svc.Name, weight, wantLocal)
	}
	if code != http.StatusOK && code != http.StatusServiceUnavailable {
		t.Errorf("health check of %s: status %d", svc.Name, code)
	}
}

// target is one address traffic goes to.
type target struct{ network, addr string }

// traffic keeps making new connections to its targets, round robin, until stopped.
type traffic struct {
	mu      sync.Mutex
	results []harness.HitResult
	cancel  context.CancelFunc
	done    chan struct{}
}

// startTraffic starts connections from ns to the targets in a loop: each round makes 4 new connections to
// every target, 4 at a time, each with a 2 s timeout.
func startTraffic(from *harness.NetNS, targets []target) *traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for ctx.Err() == nil {
			for _, tg := range targets {
				res, _ := harness.HitWith(ctx, from, tg.network, tg.addr, 4, harness.HitOptions{Concurrency: 4, Timeout: 2 * time.Second})
				if ctx.Err() != nil {
					return // connections cut short by the stop are not failures of the proxy
				}
				tr.mu.Lock()
				tr.results = append(tr.results, res...)
				tr.mu.Unlock()
			}
		}
	}()
	return tr
}

func (tr *traffic) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.results)
}

// waitFor waits until at least n connections have completed.
func (tr *traffic) waitFor(t testing.TB, n int) {
	t.Helper()
	eventually(t, strconv.Itoa(n)+" connections", time.Minute, func() (bool, string) {
		c := tr.count()
		return c >= n, strconv.Itoa(c) + " so far"
	})
}

// stop ends the loop and returns every result.
func (tr *traffic) stop() []harness.HitResult {
	tr.cancel()
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.results
}

// udpFlow is one UDP socket in a namespace, connected to a Service: every datagram it sends belongs to the
// same conntrack entry.
type udpFlow struct {
	conn net.Conn
}

func newUDPFlow(t *testing.T, from *harness.NetNS, addr string) *udpFlow {
	t.Helper()
	var conn net.Conn
	err := from.Do(func() error {
		var err error
		conn, err = net.Dial("udp4", addr)
		return err
	})
	if err != nil {
		t.Fatalf("UDP socket to %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &udpFlow{conn: conn}
}

// ask sends one datagram and returns the name of the pod that answered ("" when none did within 1 s).
func (u *udpFlow) ask(t *testing.T) string {
	t.Helper()
	_ = u.conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := u.conn.Write([]byte("hit\n")); err != nil {
		return ""
	}
	buf := make([]byte, 512)
	n, err := u.conn.Read(buf)
	if err != nil {
		return ""
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
