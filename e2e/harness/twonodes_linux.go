package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A two-node topology (TopologyOptions.NodeBPods) is wired like this:
//
//	                          LAN namespace: bridge br0
//	              ┌────────────────────┼────────────────────┐
//	node eth0 10.250.0.1/24   client eth0 10.250.0.2/24   node B eth0 10.250.0.3/24
//	  veth-pod<i> 10.244.<i>.1/24                            veth-pod<100+i> 10.244.<100+i>.1/24
//	    pod<i> eth0 10.244.<i>.2/24                            pod<100+i> eth0 10.244.<100+i>.2/24
//
// The node routes NodeBPodCIDR via NodeBIP and node B routes NodePodCIDR via NodeIP, as a cluster's
// pod network would; both route ServiceCIDR out of eth0 from their own address (see Topology), forward,
// send no ICMP redirects and have no ICMP rate limit. The client's default route leads to the node,
// and it reaches node B directly on the shared network. The bridge lives in a namespace of its own,
// never in the root namespace; only veths are created, each end directly in its namespace.

// maxNodePods and maxNodeBPods keep each node's pods inside its pod range (NodePodCIDR: 10.244.0-63,
// NodeBPodCIDR: 10.244.64-127).
const (
	maxNodePods  = 63
	maxNodeBPods = 127 - NodeBPodBase
)

// checkTwoNodes validates the two-node options.
func checkTwoNodes(opts TopologyOptions) error {
	switch {
	case opts.NodeBPods == 0:
		return nil
	case opts.NodeBPods < 0 || opts.NodeBPods > maxNodeBPods:
		return errors.New("topology: node B's pods must be 1..27")
	case opts.Pods > maxNodePods:
		return errors.New("topology: with two nodes the node's pods must be 1..63")
	case opts.IPv6:
		return errors.New("topology: two nodes are IPv4 only")
	}
	return nil
}

// wireTwoNodes creates node B, its pods and the LAN, and wires all of the topology as drawn above; the
// node, the client and the node's pods exist already (not wired).
func (t *Topology) wireTwoNodes(ctx context.Context, opts TopologyOptions) (err error) {
	t.NodeBIP = NodeBIP
	if t.NodeB, err = NewNetNS("nodeb"); err != nil {
		return err
	}
	if t.LAN, err = NewNetNS("lan"); err != nil {
		return err
	}
	if t.PodsB, err = newPods(NodeBPodBase, opts.NodeBPods, false); err != nil {
		return err
	}
	// Each host's eth0 is a veth whose peer is created directly in the LAN namespace.
	hosts := []struct {
		ns         *NetNS
		port, addr string
		pods       []*Pod
		routes     []string
	}{
		{t.Node, "node", NodeIP, t.Pods, []string{
			"route add " + ServiceCIDR + " dev eth0 src " + NodeIP,
			"route add " + NodeBPodCIDR + " via " + NodeBIP}},
		{t.NodeB, "nodeb", NodeBIP, t.PodsB, []string{
			"route add " + ServiceCIDR + " dev eth0 src " + NodeBIP,
			"route add " + NodePodCIDR + " via " + NodeIP}},
		{t.Client, "client", ClientIP, nil, []string{"route add default via " + NodeIP}},
	}
	lan := []string{"link add br0 type bridge", "link set br0 up"}
	for _, h := range hosts {
		cmds := []string{
			"link add eth0 type veth peer name " + h.port + " netns " + t.LAN.Name,
			"addr add " + h.addr + "/24 dev eth0",
			"link set eth0 up",
		}
		cmds = append(cmds, h.routes...)
		cmds = append(cmds, podLinks(h.pods, false)...)
		if err := h.ns.IPBatch(ctx, cmds); err != nil {
			return err
		}
		lan = append(lan, "link set dev "+h.port+" master br0", "link set dev "+h.port+" up")
	}
	if err := t.LAN.IPBatch(ctx, lan); err != nil {
		return err
	}
	if err := configurePods(ctx, t.AllPods(), opts); err != nil {
		return err
	}
	sysctls := []string{"net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
		"net.ipv4.conf.eth0.send_redirects=0", "net.ipv4.icmp_ratelimit=0"}
	for _, n := range []*NetNS{t.Node, t.NodeB} {
		if err := n.Sysctl(ctx, sysctls...); err != nil {
			return err
		}
	}
	return t.waitLinksUp(ctx)
}

// waitLinksUp waits (5 s at most) until every link of the topology is operationally up. A veth has no
// carrier until its peer is up, and the kernel processes the carrier change (the link's queueing
// discipline, the bridge port's forwarding state) up to a second later: until then the link drops or
// holds what is sent, and a test's first connections would wait for a TCP retransmission (1 s).
func (t *Topology) waitLinksUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, n := range t.Namespaces() {
		for {
			out, err := n.IP(ctx, "-o", "link", "show")
			if err != nil {
				return err
			}
			down := linksDown(out)
			if len(down) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("links of %s still down: %s", n.Name, strings.Join(down, ", "))
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// linksDown returns the links of `ip -o link show` output without carrier or operationally down (state
// UNKNOWN, as loopback's and an idle bridge's, counts as up).
func linksDown(out string) []string {
	var down []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if strings.Contains(line, "NO-CARRIER") || strings.Contains(line, " state DOWN ") || strings.Contains(line, " state LOWERLAYERDOWN ") {
			down = append(down, name)
		}
	}
	return down
}

// addNodeB gives a two-node bed node B's Node object (removed when t ends) and an apiserver bridge
// (Cluster.Bridge) into node B's namespace; NewBed calls it once the topology is up.
func (b *Bed) addNodeB(t *testing.T) {
	t.Helper()
	b.NodeB = b.Node + "-b"
	EnsureNode(t, b.Cluster, b.NodeB, NodeBIP, NodeBPodCIDR,
		map[string]string{corev1.LabelTopologyZone: ZoneThere, corev1.LabelHostname: b.NodeB})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.Cluster.Admin.CoreV1().Nodes().Delete(ctx, b.NodeB, metav1.DeleteOptions{})
	})
	b.KubeconfigB = b.Cluster.BridgeForTest(t, b.Topo.NodeB)
}

// nodeOf returns the name of the Node pod i runs on: NodeB for node B's pods, else the bed's Node.
func (b *Bed) nodeOf(pod int) string {
	if b.NodeB != "" && pod > NodeBPodBase {
		return b.NodeB
	}
	return b.Node
}
