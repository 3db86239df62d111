package harness_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// wantAll checks that every one of n hits was answered by pod want, seen from a client address whose
// IP is seenIP.
func wantAll(t *testing.T, what string, res []harness.HitResult, n int, want, seenIP string) {
	t.Helper()
	counts := harness.CountHits(res)
	if counts[want] != n || len(counts) != 1 {
		t.Errorf("%s: got %s, want %s=%d", what, harness.FormatHits(counts), want, n)
		for _, r := range res {
			if r.Err != "" {
				t.Logf("  %s: %s", r.Err, r.Detail)
				break
			}
		}
		return
	}
	for _, r := range res {
		host, _, err := net.SplitHostPort(r.Seen)
		if err != nil || host != seenIP {
			t.Errorf("%s: pod saw client %q, want IP %s", what, r.Seen, seenIP)
			return
		}
	}
}

func TestTopologyRoutingWithoutRules(t *testing.T) {
	harness.Require(t, "iptables-save", "nft")
	noNamespacesLeft(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	topo := harness.TopologyForTest(t, harness.TopologyOptions{Pods: 3, IPv6: true})
	setup := time.Since(start)
	start = time.Now()
	if err := topo.StartServers(ctx, []int{8080, 9090}, []int{5353}); err != nil {
		t.Fatal(err)
	}
	t.Logf("topology (3 pods, IPv4+IPv6) set up in %v; pod servers ready in %v",
		setup.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	const n = 5
	for i, pod := range topo.Pods {
		cases := []struct {
			from          *harness.NetNS
			fromName      string
			network, addr string
			seenIP        string
		}{
			{topo.Node, "node", "tcp", net.JoinHostPort(pod.IP, "8080"), pod.Gateway},
			{topo.Node, "node", "tcp", net.JoinHostPort(pod.IP, "9090"), pod.Gateway},
			{topo.Node, "node", "udp", net.JoinHostPort(pod.IP, "5353"), pod.Gateway},
			{topo.Node, "node", "tcp6", net.JoinHostPort(pod.IPv6, "8080"), harness.PodGatewayIPv6(i + 1)},
			{topo.Client, "client", "tcp", net.JoinHostPort(pod.IP, "8080"), harness.ClientIP},
			{topo.Client, "client", "udp", net.JoinHostPort(pod.IP, "5353"), harness.ClientIP},
			{topo.Client, "client", "tcp6", net.JoinHostPort(pod.IPv6, "8080"), harness.ClientIPv6},
			{topo.Client, "client", "udp6", net.JoinHostPort(pod.IPv6, "5353"), harness.ClientIPv6},
		}
		for _, c := range cases {
			what := c.fromName + " -> " + c.network + " " + c.addr
			res, err := harness.HitDetailed(ctx, c.from, c.network, c.addr, n)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			wantAll(t, what, res, n, pod.Name, c.seenIP)
		}
	}

	// A pod answers another pod directly (through the node).
	res, err := harness.HitDetailed(ctx, topo.Pods[0].NS, "tcp", net.JoinHostPort(topo.Pods[1].IP, "8080"), n)
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, "pod1 -> pod2", res, n, topo.Pods[1].Name, topo.Pods[0].IP)

	// Nothing answers a ClusterIP or a closed port: the bed hides no bugs.
	short := harness.HitOptions{Timeout: 300 * time.Millisecond}
	for _, c := range []struct {
		from          *harness.NetNS
		network, addr string
		want          string
	}{
		{topo.Client, "tcp", "10.96.0.10:80", "ERR:timeout"},
		{topo.Client, "udp", "10.96.0.10:53", "ERR:timeout"},
		{topo.Node, "tcp", "10.96.0.10:80", "ERR:timeout"},
		{topo.Client, "tcp", net.JoinHostPort(topo.Pods[0].IP, "1"), "ERR:refused"},
		{topo.Client, "udp", net.JoinHostPort(topo.Pods[0].IP, "1"), "ERR:refused"},
	} {
		res, err := harness.HitWith(ctx, c.from, c.network, c.addr, 2, short)
		if err != nil {
			t.Fatal(err)
		}
		got := harness.CountHits(res)
		if c.network == "udp" && c.want == "ERR:refused" && got["ERR:refused"] >= 1 && got["ERR:refused"]+got["ERR:timeout"] == 2 {
			// A closed UDP port answers with an ICMP error, which the kernel rate-limits (icmp_ratelimit):
			// the second may not be sent, and that datagram times out instead. Nothing may answer.
			continue
		}
		if got[c.want] != 2 {
			t.Errorf("%s %s from %s: got %s, want %s=2", c.network, c.addr, c.from.Name, harness.FormatHits(got), c.want)
		}
	}

	// No rules anywhere in the node.
	if out, err := topo.Node.Run(ctx, "iptables-save"); err != nil || strings.Contains(out, "\n-A ") {
		t.Errorf("node has iptables rules (err %v):\n%s", err, out)
	}
	if out, err := topo.Node.Run(ctx, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("node has an nftables ruleset (err %v):\n%s", err, out)
	}
}

func TestTopologyWithoutPodDefaultRoute(t *testing.T) {
	harness.Require(t)
	noNamespacesLeft(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topo := harness.TopologyForTest(t, harness.TopologyOptions{Pods: 1, NoPodDefaultRoute: true})
	if err := topo.StartServers(ctx, []int{8080}, nil); err != nil {
		t.Fatal(err)
	}
	pod := topo.Pods[0]
	addr := net.JoinHostPort(pod.IP, "8080")
	res, err := harness.HitDetailed(ctx, topo.Node, "tcp", addr, 3)
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, "node -> pod", res, 3, pod.Name, pod.Gateway)
	// The pod cannot route its answer back to the client: only SNAT by the node would make this work.
	got, err := harness.HitWith(ctx, topo.Client, "tcp", addr, 2, harness.HitOptions{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if c := harness.CountHits(got); c["ERR:timeout"] != 2 {
		t.Errorf("client -> pod without a pod default route: got %s, want ERR:timeout=2", harness.FormatHits(c))
	}
}
