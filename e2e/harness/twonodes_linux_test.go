package harness_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

func TestTwoNodeTopologyRoutingWithoutRules(t *testing.T) {
	harness.Require(t, "iptables-save")
	noNamespacesLeft(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topo := harness.TopologyForTest(t, harness.TopologyOptions{Pods: 1, NodeBPods: 1})
	if err := topo.StartServers(ctx, []int{8080}, []int{5353}); err != nil {
		t.Fatal(err)
	}
	podA, podB := topo.Pods[0], topo.PodsB[0]
	if podB.Name != "pod101" || podB.IP != harness.PodIP(101) || topo.PodByName("pod101") != podB {
		t.Fatalf("node B's pod: %s %s, want pod101 at %s", podB.Name, podB.IP, harness.PodIP(101))
	}
	// The links are up when the constructor returns: the very first connection across the shared network
	// needs no retransmission (the first would come after 1 s).
	first, err := harness.HitWith(ctx, topo.Client, "tcp", net.JoinHostPort(podB.IP, "8080"), 1, harness.HitOptions{Timeout: 900 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wantAll(t, "first connection, client -> pod101", first, 1, podB.Name, harness.ClientIP)

	const n = 5
	for _, c := range []struct {
		what          string
		from          *harness.NetNS
		network, addr string
		pod, seenIP   string
	}{
		// Pods reach each other across the nodes unchanged, each node routing the other's pod range.
		{"pod1 -> pod101", podA.NS, "tcp", net.JoinHostPort(podB.IP, "8080"), podB.Name, podA.IP},
		{"pod101 -> pod1", podB.NS, "tcp", net.JoinHostPort(podA.IP, "8080"), podA.Name, podB.IP},
		{"pod101 -> pod1 udp", podB.NS, "udp", net.JoinHostPort(podA.IP, "5353"), podA.Name, podB.IP},
		// The nodes reach the other node's pods from their primary address.
		{"node A -> pod101", topo.Node, "tcp", net.JoinHostPort(podB.IP, "8080"), podB.Name, harness.NodeIP},
		{"node B -> pod1", topo.NodeB, "tcp", net.JoinHostPort(podA.IP, "8080"), podA.Name, harness.NodeBIP},
		// The client's route leads to node A; node B's pods answer it directly over the shared network.
		{"client -> pod1", topo.Client, "tcp", net.JoinHostPort(podA.IP, "8080"), podA.Name, harness.ClientIP},
		{"client -> pod101", topo.Client, "tcp", net.JoinHostPort(podB.IP, "8080"), podB.Name, harness.ClientIP},
		{"client -> pod101 udp", topo.Client, "udp", net.JoinHostPort(podB.IP, "5353"), podB.Name, harness.ClientIP},
	} {
		res, err := harness.HitDetailed(ctx, c.from, c.network, c.addr, n)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		wantAll(t, c.what, res, n, c.pod, c.seenIP)
	}

	// Nothing answers a ClusterIP or a closed port.
	short := harness.HitOptions{Timeout: 300 * time.Millisecond}
	for _, c := range []struct {
		from          *harness.NetNS
		network, addr string
		want          string
	}{
		{podB.NS, "tcp", "10.96.0.10:80", "ERR:timeout"},
		{topo.NodeB, "tcp", "10.96.0.10:80", "ERR:timeout"},
		{topo.Client, "tcp", net.JoinHostPort(harness.NodeBIP, "30080"), "ERR:refused"},
		{topo.Client, "tcp", net.JoinHostPort(podB.IP, "1"), "ERR:refused"},
	} {
		res, err := harness.HitWith(ctx, c.from, c.network, c.addr, 2, short)
		if err != nil {
			t.Fatal(err)
		}
		if got := harness.CountHits(res); got[c.want] != 2 {
			t.Errorf("%s %s from %s: got %s, want %s=2", c.network, c.addr, c.from.Name, harness.FormatHits(got), c.want)
		}
	}

	// The bridge is in the LAN namespace, with the three hosts' links as its ports; no node has rules.
	out, err := topo.LAN.IP(ctx, "-o", "link", "show", "master", "br0")
	if err != nil || strings.Count(out, "\n") != 3 {
		t.Errorf("ports of br0 in the LAN namespace (err %v):\n%s", err, out)
	}
	for _, ns := range []*harness.NetNS{topo.Node, topo.NodeB} {
		if out, err := ns.Run(ctx, "iptables-save"); err != nil || strings.Contains(out, "\n-A ") {
			t.Errorf("%s has iptables rules (err %v):\n%s", ns.Name, err, out)
		}
	}
	if got := len(topo.Namespaces()); got != 6 {
		t.Errorf("Namespaces: %d, want 6 (node, client, pod1, node B, LAN, pod101)", got)
	}
}

func TestTwoNodeTopologyOptionsChecked(t *testing.T) {
	for _, opts := range []harness.TopologyOptions{
		{Pods: 1, NodeBPods: 28},
		{Pods: 1, NodeBPods: -1},
		{Pods: 64, NodeBPods: 1},
		{Pods: 1, NodeBPods: 1, IPv6: true},
	} {
		// Checked before anything is created, so this needs no root.
		if topo, err := harness.NewTopologyWith(context.Background(), opts); err == nil {
			_ = topo.Close()
			t.Errorf("NewTopologyWith(%+v): no error", opts)
		}
	}
}
