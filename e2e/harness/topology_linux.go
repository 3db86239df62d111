package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Topology is the data-plane test bed: a "node" namespace that forwards (ip_forward=1), N "pod"
// namespaces each on a veth to the node, and a "client" namespace on the node's primary network.
//
//	client eth0 10.250.0.2/24 ── node eth0 10.250.0.1/24 (NodeIP, outside the pod CIDR)
//	                             node veth-pod<i> 10.244.<i>.1/24 ── pod<i> eth0 10.244.<i>.2/24
//
// The client's and the pods' only routes off their link lead to the node. The node routes
// ServiceCIDR towards its eth0 (source NodeIP), as a node's default route would, so connections it
// originates to ClusterIPs find a route before DNAT; without rules such traffic goes nowhere. There
// are no iptables rules or other filtering: whatever a test installs in the node is all there is.
// With IPv6 the same shape exists with fd00:10:250::/64 and fd00:10:244:<i>::/64.
type Topology struct {
	// Node is the namespace the proxy under test programs.
	Node *NetNS
	// Client is an outside host on the node's primary network.
	Client *NetNS
	// Pods are the pod namespaces, Pods[i-1] being pod i.
	Pods []*Pod
	// NodeIP and ClientIP are the node's primary and the client's address (NodeIP, ClientIP).
	NodeIP, ClientIP string
	// NodeIPv6 and ClientIPv6 are set when the topology has IPv6.
	NodeIPv6, ClientIPv6 string
	// Dir holds pod server logs; removed by Close.
	Dir string

	// NodeB is the second node of a two-node topology (TopologyOptions.NodeBPods), nil otherwise.
	NodeB *NetNS
	// PodsB are node B's pods, PodsB[i-1] being pod NodeBPodBase+i (named "pod<100+i>").
	PodsB []*Pod
	// NodeBIP is node B's primary address (NodeBIP) in a two-node topology.
	NodeBIP string
	// LAN holds the bridge that joins the node, node B and the client in a two-node topology.
	LAN *NetNS

	servers []*Process
}

// Pod is one pod namespace of a Topology.
type Pod struct {
	// NS is the pod's namespace.
	NS *NetNS
	// Name is "pod<i>", what the pod server answers with.
	Name string
	// IP is the pod's IPv4 address, 10.244.<i>.2.
	IP string
	// IPv6 is the pod's IPv6 address (empty without IPv6).
	IPv6 string
	// Gateway is the node's address on the pod's link, 10.244.<i>.1.
	Gateway string
	// NodeLink is the name of the node's end of the pod's veth, "veth-pod<i>".
	NodeLink string

	num int // i
}

// TopologyOptions tunes NewTopologyWith.
type TopologyOptions struct {
	// Pods is the number of pod namespaces (1..250).
	Pods int
	// IPv6 adds IPv6 addresses and routes (no DAD delay) alongside IPv4.
	IPv6 bool
	// NoPodDefaultRoute gives pods a route to PodCIDR via the node instead of a default route, so a
	// pod can answer a client outside the pod CIDR only if the node masqueraded the connection.
	NoPodDefaultRoute bool
	// NodeBPods, when positive, makes the topology two nodes (see twonodes_linux.go): a second node
	// namespace, node B at NodeBIP, with that many pods of its own (1..27, numbered from
	// NodeBPodBase+1), and the node, node B and the client on one shared network, a bridge inside a
	// namespace of its own (LAN). The node's pods are then at most 63 (NodePodCIDR). IPv4 only.
	NodeBPods int
}

// NewTopology creates a topology with pods pod namespaces, IPv4 only.
func NewTopology(ctx context.Context, pods int) (*Topology, error) {
	return NewTopologyWith(ctx, TopologyOptions{Pods: pods})
}

// NewTopologyWith creates a topology as opts says. On error everything created is removed.
func NewTopologyWith(ctx context.Context, opts TopologyOptions) (t *Topology, err error) {
	if opts.Pods < 1 || opts.Pods > 250 {
		return nil, fmt.Errorf("topology: %d pods, want 1..250", opts.Pods)
	}
	if err := checkTwoNodes(opts); err != nil {
		return nil, err
	}
	t = &Topology{NodeIP: NodeIP, ClientIP: ClientIP}
	if opts.IPv6 {
		t.NodeIPv6, t.ClientIPv6 = NodeIPv6, ClientIPv6
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
			t = nil
		}
	}()
	if t.Dir, err = os.MkdirTemp("", "kpt-topology-"); err != nil {
		return t, fmt.Errorf("topology dir: %w", err)
	}
	if t.Node, err = NewNetNS("node"); err != nil {
		return t, err
	}
	if t.Client, err = NewNetNS("client"); err != nil {
		return t, err
	}
	if t.Pods, err = newPods(0, opts.Pods, opts.IPv6); err != nil {
		return t, err
	}
	if opts.NodeBPods > 0 {
		return t, t.wireTwoNodes(ctx, opts)
	}

	// Node side: both ends of every veth are created directly in their namespaces; nothing is ever
	// created in (or moved through) the root namespace.
	node := []string{
		"link add eth0 type veth peer name eth0 netns " + t.Client.Name,
		"addr add " + NodeIP + "/24 dev eth0",
		"link set eth0 up",
		"route add " + ServiceCIDR + " dev eth0 src " + NodeIP,
	}
	if opts.IPv6 {
		node = append(node,
			"addr add "+NodeIPv6+"/64 dev eth0 nodad",
			"route add "+ServiceCIDRv6+" dev eth0 src "+NodeIPv6)
	}
	node = append(node, podLinks(t.Pods, opts.IPv6)...)
	if err := t.Node.IPBatch(ctx, node); err != nil {
		return t, err
	}
	client := []string{"addr add " + ClientIP + "/24 dev eth0", "link set eth0 up", "route add default via " + NodeIP}
	if opts.IPv6 {
		client = append(client, "addr add "+ClientIPv6+"/64 dev eth0 nodad", "route add ::/0 via "+NodeIPv6)
	}
	if err := t.Client.IPBatch(ctx, client); err != nil {
		return t, err
	}
	if err := configurePods(ctx, t.Pods, opts); err != nil {
		return t, err
	}
	// No ICMP redirects (the node routes the service CIDR back out of eth0) and no ICMP rate limit, which
	// redirects would share with REJECT's errors: clients must see "connection refused" at once.
	sysctls := []string{"net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.icmp_ratelimit=0"}
	if opts.IPv6 {
		sysctls = append(sysctls, "net.ipv6.conf.all.forwarding=1")
	}
	if err := t.Node.Sysctl(ctx, sysctls...); err != nil {
		return t, err
	}
	return t, nil
}

// newPods creates the namespaces of n pods numbered from base+1 (not yet wired).
func newPods(base, n int, ipv6 bool) ([]*Pod, error) {
	var pods []*Pod
	for i := base + 1; i <= base+n; i++ {
		ns, err := NewNetNS("pod" + strconv.Itoa(i))
		if err != nil {
			return pods, err
		}
		p := &Pod{NS: ns, Name: "pod" + strconv.Itoa(i), IP: PodIP(i), Gateway: PodGatewayIP(i), NodeLink: "veth-pod" + strconv.Itoa(i), num: i}
		if ipv6 {
			p.IPv6 = PodIPv6(i)
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// podLinks are the node's `ip` commands creating each pod's veth (its peer directly in the pod's
// namespace) with the node's gateway address on it.
func podLinks(pods []*Pod, ipv6 bool) []string {
	var cmds []string
	for _, p := range pods {
		cmds = append(cmds,
			"link add "+p.NodeLink+" type veth peer name eth0 netns "+p.NS.Name,
			"addr add "+p.Gateway+"/24 dev "+p.NodeLink,
			"link set "+p.NodeLink+" up")
		if ipv6 {
			cmds = append(cmds, "addr add "+gatewayIPv6(p)+"/64 dev "+p.NodeLink+" nodad")
		}
	}
	return cmds
}

// configurePods gives each pod its addresses and its route(s) via the node.
func configurePods(ctx context.Context, pods []*Pod, opts TopologyOptions) error {
	for _, p := range pods {
		cmds := []string{"addr add " + p.IP + "/24 dev eth0", "link set eth0 up"}
		if opts.NoPodDefaultRoute {
			cmds = append(cmds, "route add "+PodCIDR+" via "+p.Gateway)
		} else {
			cmds = append(cmds, "route add default via "+p.Gateway)
		}
		if opts.IPv6 {
			cmds = append(cmds, "addr add "+p.IPv6+"/64 dev eth0 nodad")
			if opts.NoPodDefaultRoute {
				cmds = append(cmds, "route add "+PodCIDRv6+" via "+gatewayIPv6(p))
			} else {
				cmds = append(cmds, "route add ::/0 via "+gatewayIPv6(p))
			}
		}
		if err := p.NS.IPBatch(ctx, cmds); err != nil {
			return err
		}
	}
	return nil
}

// gatewayIPv6 is the node's IPv6 address on a pod's link.
func gatewayIPv6(p *Pod) string { return PodGatewayIPv6(p.num) }

// Sysctl sets "key=value" sysctls inside the namespace (`ip netns exec NAME sysctl -w`), so only the
// namespace's own per-namespace settings change.
func (n *NetNS) Sysctl(ctx context.Context, settings ...string) error {
	for _, s := range settings {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("sysctl %q: want key=value", s)
		}
	}
	_, err := n.Run(ctx, append([]string{"sysctl", "-q", "-w"}, settings...)...)
	return err
}

// Namespaces returns every namespace of the topology: node, client, pods, then (two nodes) node B,
// the LAN and node B's pods.
func (t *Topology) Namespaces() []*NetNS {
	var out []*NetNS
	for _, n := range []*NetNS{t.Node, t.Client} {
		if n != nil {
			out = append(out, n)
		}
	}
	for _, p := range t.Pods {
		out = append(out, p.NS)
	}
	for _, n := range []*NetNS{t.NodeB, t.LAN} {
		if n != nil {
			out = append(out, n)
		}
	}
	for _, p := range t.PodsB {
		out = append(out, p.NS)
	}
	return out
}

// PodByName returns the pod with the given name, or nil.
func (t *Topology) PodByName(name string) *Pod {
	for _, p := range t.AllPods() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// AllPods returns the node's pods followed by node B's.
func (t *Topology) AllPods() []*Pod {
	return append(append([]*Pod(nil), t.Pods...), t.PodsB...)
}

// StartServers runs the pod server (e2e/podserver) in every pod namespace (node B's too), answering on
// tcpPorts and udpPorts, and waits until each has bound its sockets. Servers run until Close. Each call
// starts a new set of servers, so ports must not repeat across calls.
func (t *Topology) StartServers(ctx context.Context, tcpPorts, udpPorts []int) error {
	bin, err := BuildPodServer()
	if err != nil {
		return err
	}
	join := func(ports []int) string {
		s := make([]string, len(ports))
		for i, p := range ports {
			s[i] = strconv.Itoa(p)
		}
		return strings.Join(s, ",")
	}
	set := len(t.servers)
	var readies []string
	var procs []*Process
	for _, p := range t.AllPods() {
		tag := fmt.Sprintf("%s-%d", p.Name, set)
		ready := filepath.Join(t.Dir, tag+".ready")
		// Not ctx: the servers outlive this call and are stopped by Close.
		cmd := p.NS.Command(context.Background(), bin, "-name", p.Name, "-tcp", join(tcpPorts), "-udp", join(udpPorts), "-ready", ready)
		proc, err := StartProcess("podserver "+p.Name, cmd, filepath.Join(t.Dir, tag+".log"))
		if err != nil {
			return err
		}
		t.servers = append(t.servers, proc)
		procs = append(procs, proc)
		readies = append(readies, ready)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i, ready := range readies {
		for {
			if _, err := os.Stat(ready); err == nil {
				break
			}
			if procs[i].Exited() {
				return fmt.Errorf("%s exited: %v\n%s", procs[i].Name, procs[i].ExitErr(), procs[i].LogTail(20))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", procs[i].Name, ctx.Err())
			case <-tick.C:
			}
		}
	}
	return nil
}

// Close stops the pod servers and deletes every namespace of the topology (the veths go with them)
// and Dir; the LAN, whose bridge the nodes and the client are attached to, goes last. It is safe to
// call more than once.
func (t *Topology) Close() error {
	var errs []error
	for _, s := range t.servers {
		if err := s.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	t.servers = nil
	// Pods first, the node last: deleting a namespace removes the veths with their peers.
	for _, p := range t.AllPods() {
		errs = append(errs, p.NS.Delete())
	}
	for _, n := range []*NetNS{t.Client, t.NodeB, t.Node, t.LAN} {
		if n != nil {
			errs = append(errs, n.Delete())
		}
	}
	if t.Dir != "" {
		errs = append(errs, os.RemoveAll(t.Dir))
	}
	return errors.Join(errs...)
}
