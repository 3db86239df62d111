package harness

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The ports a Bed's pod servers answer on, and the Service ports WebPorts puts in front of them.
const (
	PodTCPPort     = 8080
	PodUDPPort     = 5353
	ServiceTCPPort = 80
	ServiceUDPPort = 53
)

// Topology facts a Bed gives its Node and that tests give endpoints.
const (
	// OtherNode is the node name of endpoints "on another node" (the pods are all wired to the bed's
	// node, so traffic to them still works).
	OtherNode = "node-elsewhere"
	// ZoneHere is the zone of the bed's Node; ZoneThere is another one.
	ZoneHere  = "zone-a"
	ZoneThere = "zone-b"
)

// Bed is one end-to-end test's world: a Topology (node namespace, pods serving PodTCPPort and
// PodUDPPort, a client), a Kubernetes namespace and a Node object of its own in the package's
// SharedCluster (or, dual-stack, in a cluster of its own), and one apiserver bridge into the node
// namespace that every proxy the test starts there shares. The Services and EndpointSlices it writes are
// deleted when the test ends, so that the proxies of later tests do not program them (nothing else
// garbage-collects them without a controller-manager).
type Bed struct {
	Cluster *Cluster
	Topo    *Topology
	// DualStack is set when the bed has IPv6 too (BedOptions.DualStack).
	DualStack bool
	// NS is the Kubernetes namespace of the test's Services.
	NS string
	// Node is the name of the Node object, in ZoneHere, with InternalIP NodeIP: the proxies' hostnameOverride.
	Node string
	// Kubeconfig reaches the apiserver from inside the node namespace (user system:kube-proxy).
	Kubeconfig string
	// NodeB is the name of node B's Node object in a two-node bed (BedOptions.NodeBPods), in ZoneThere,
	// with InternalIP NodeBIP and podCIDR NodeBPodCIDR; empty otherwise.
	NodeB string
	// KubeconfigB reaches the apiserver from inside node B's namespace, in a two-node bed.
	KubeconfigB string
}

// BedOptions tune NewBed.
type BedOptions struct {
	// Pods is the number of pod namespaces.
	Pods int
	// Prefix starts the Kubernetes namespace's name (lower-case letters and dashes; default "bed").
	Prefix string
	// Tools are the commands the test needs besides ip and sysctl (see RequireCluster).
	Tools []string
	// DualStack gives the bed a dual-stack cluster of its own (service CIDRs ServiceCIDR and
	// ServiceCIDRv6, started for the test: a few seconds), a topology with IPv6, and a Node with both
	// NodeIP and NodeIPv6. CreateService then makes RequireDualStack Services, and SetEndpoints writes an
	// IPv6 EndpointSlice beside the IPv4 one.
	DualStack bool
	// NodeBPods makes the bed two nodes (see TopologyOptions.NodeBPods): node B's namespace with that many
	// pods, a Node object of its own (NodeB), and an apiserver bridge into it (KubeconfigB); the bed's
	// Node then has podCIDR NodePodCIDR. Not with DualStack.
	NodeBPods int
}

// NewBed builds a Bed: it calls RequireCluster with opts.Tools (skipping or failing t as that says),
// creates the namespace, the Node, the topology with its pod servers, and the bridge; all of it is
// removed when t ends.
//
// The node namespace sends no ICMP redirects and has no ICMP rate limit: the client's packets to cluster
// IPs leave the node by the interface they came in on (the topology routes the service CIDR towards
// eth0), so the node would otherwise answer the first ones with redirects, which share the per-host ICMP
// rate limit with the port-unreachable errors a proxy's REJECT sends, and the client would see timeouts
// where the rules reject. The limit itself (a burst of 6, then 1/s) is lifted so that a test may probe a
// REJECT more often.
func NewBed(t *testing.T, opts BedOptions) *Bed {
	t.Helper()
	RequireCluster(t, opts.Tools...)
	if opts.Prefix == "" {
		opts.Prefix = "bed"
	}
	var c *Cluster
	if opts.DualStack {
		c = ForTestWith(t, ClusterOptions{ServiceCIDRs: ServiceCIDR + "," + ServiceCIDRv6})
	} else {
		c = SharedCluster(t)
	}
	b := &Bed{Cluster: c, DualStack: opts.DualStack}
	b.NS = c.Namespace(t, opts.Prefix)
	b.Node = "node-" + b.NS
	podCIDR := ""
	if opts.NodeBPods > 0 {
		podCIDR = NodePodCIDR
	}
	EnsureNode(t, c, b.Node, NodeIP, podCIDR, map[string]string{corev1.LabelTopologyZone: ZoneHere, corev1.LabelHostname: b.Node})
	if opts.DualStack {
		b.addNodeIPv6(t)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Admin.CoreV1().Nodes().Delete(ctx, b.Node, metav1.DeleteOptions{})
	})
	t.Cleanup(b.DeleteObjects)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.Topo = TopologyForTest(t, TopologyOptions{Pods: opts.Pods, IPv6: opts.DualStack, NodeBPods: opts.NodeBPods})
	if err := b.Topo.StartServers(ctx, []int{PodTCPPort}, []int{PodUDPPort}); err != nil {
		t.Fatal(err)
	}
	if err := b.Topo.Node.Sysctl(ctx, "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0",
		"net.ipv4.icmp_ratelimit=0"); err != nil {
		t.Fatal(err)
	}
	b.Kubeconfig = c.BridgeForTest(t, b.Topo.Node)
	if opts.NodeBPods > 0 {
		b.addNodeB(t)
	}
	return b
}

// addNodeIPv6 gives the bed's Node NodeIPv6 as a second InternalIP.
func (b *Bed) addNodeIPv6(t testing.TB) {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	api := b.Cluster.Admin.CoreV1().Nodes()
	node, err := api.Get(ctx, b.Node, metav1.GetOptions{})
	if err == nil {
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeIP}, {Type: corev1.NodeInternalIP, Address: NodeIPv6}}
		_, err = api.UpdateStatus(ctx, node, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("node %s: adding %s: %v", b.Node, NodeIPv6, err)
	}
}

// DeleteObjects deletes the EndpointSlices and Services of the bed's namespace (errors ignored), eight
// Services at a time, and waits (30 s at most) until the apiserver's watch cache shows none of them: a
// proxy started later then lists the namespace empty, instead of receiving the deletions as changes in
// the middle of another test.
func (b *Bed) DeleteObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	svcs, err := b.Cluster.Admin.CoreV1().Services(b.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	names := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range names {
				_ = b.Cluster.Admin.CoreV1().Services(b.NS).Delete(ctx, n, metav1.DeleteOptions{})
			}
		}()
	}
	for _, s := range svcs.Items {
		names <- s.Name
	}
	close(names)
	wg.Wait()
	cached := metav1.ListOptions{ResourceVersion: "0"} // served from the watch cache
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		svcs, err := b.Cluster.Admin.CoreV1().Services(b.NS).List(ctx, cached)
		if err != nil {
			return
		}
		slices, err := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS).List(ctx, cached)
		if err != nil || len(svcs.Items)+len(slices.Items) == 0 {
			return
		}
	}
}

// Ctx returns a context for one API call or command: a minute.
func (b *Bed) Ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// WebPorts are a Service's usual ports: "tcp" ServiceTCPPort -> PodTCPPort and "udp" ServiceUDPPort ->
// PodUDPPort. The port names are the protocols, so that a test can derive chain names from either.
func WebPorts() []corev1.ServicePort {
	return []corev1.ServicePort{
		{Name: "tcp", Port: ServiceTCPPort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(PodTCPPort)},
		{Name: "udp", Port: ServiceUDPPort, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(PodUDPPort)},
	}
}

// CreateService creates a ClusterIP Service with WebPorts in the bed's namespace (RequireDualStack, IPv4
// first, in a dual-stack bed), changed by mutate (nil: unchanged), and returns it as stored (cluster IPs
// and node ports allocated).
func (b *Bed) CreateService(t testing.TB, name string, mutate func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.NS},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: WebPorts()},
	}
	if b.DualStack {
		svc.Spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicyRequireDualStack)
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
	if mutate != nil {
		mutate(svc)
	}
	ctx, cancel := b.Ctx()
	defer cancel()
	out, err := b.Cluster.Admin.CoreV1().Services(b.NS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	return out
}

// DeleteService deletes a Service and the EndpointSlice SetEndpoints wrote for it.
func (b *Bed) DeleteService(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	if err := b.Cluster.Admin.CoreV1().Services(b.NS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting Service %s: %v", name, err)
	}
	for _, slice := range []string{name + "-slice", name + "-slice-v6"} {
		err := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS).Delete(ctx, slice, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting EndpointSlice of %s: %v", name, err)
		}
	}
}

// Endpoint is one endpoint of an EndpointSlice written by SetEndpoints: pod Pod of the bed.
type Endpoint struct {
	// Pod is the pod's number (from 1); its address is PodIP(Pod).
	Pod int
	// Node is the endpoint's nodeName; empty means the node the pod runs on: the bed's Node, or NodeB
	// for node B's pods.
	Node                        string
	Ready, Serving, Terminating bool
	// Zones are the endpoint's zone hints (none when empty).
	Zones []string
}

// ReadyEndpoint is a ready endpoint on the node its pod runs on.
func ReadyEndpoint(pod int) Endpoint { return Endpoint{Pod: pod, Ready: true, Serving: true} }

// RemoteEndpoint is a ready endpoint on OtherNode.
func RemoteEndpoint(pod int) Endpoint {
	return Endpoint{Pod: pod, Node: OtherNode, Ready: true, Serving: true}
}

// SetEndpoints creates or replaces the one EndpointSlice ("<svc>-slice") of Service svc, with ports "tcp"
// (PodTCPPort) and "udp" (PodUDPPort); in a dual-stack bed also the IPv6 one ("<svc>-slice-v6"), with
// the same endpoints at their IPv6 addresses.
func (b *Bed) SetEndpoints(t testing.TB, svc string, eps ...Endpoint) {
	t.Helper()
	b.setSlice(t, svc, svc+"-slice", discoveryv1.AddressTypeIPv4, PodIP, eps)
	if b.DualStack {
		b.setSlice(t, svc, svc+"-slice-v6", discoveryv1.AddressTypeIPv6, PodIPv6, eps)
	}
}

func (b *Bed) setSlice(t testing.TB, svc, name string, family discoveryv1.AddressType, addr func(int) string, eps []Endpoint) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: b.NS, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: family,
		Ports:       webSlicePorts(),
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, e := range eps {
		node := e.Node
		if node == "" {
			node = b.nodeOf(e.Pod)
		}
		de := discoveryv1.Endpoint{
			Addresses: []string{addr(e.Pod)},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptrTo(e.Ready), Serving: ptrTo(e.Serving), Terminating: ptrTo(e.Terminating)},
			NodeName: ptrTo(node),
		}
		if len(e.Zones) > 0 {
			de.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.Zones {
				de.Hints.ForZones = append(de.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		slice.Endpoints = append(slice.Endpoints, de)
	}
	ctx, cancel := b.Ctx()
	defer cancel()
	api := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS)
	cur, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
	case err == nil:
		slice.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, slice, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("writing EndpointSlice of %s: %v", svc, err)
	}
}

// webSlicePorts are the EndpointSlice ports matching WebPorts.
func webSlicePorts() []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{
		{Name: ptrTo("tcp"), Port: ptrTo[int32](PodTCPPort), Protocol: ptrTo(corev1.ProtocolTCP)},
		{Name: ptrTo("udp"), Port: ptrTo[int32](PodUDPPort), Protocol: ptrTo(corev1.ProtocolUDP)},
	}
}

// BigService creates Service name with n endpoints on OtherNode (addresses BigServiceAddr(i), never
// connected to), in EndpointSlices of 1000 endpoints ("<name>-<k>") written before the Service itself, so
// that a proxy sees the Service with all of them in one sync.
func (b *Bed) BigService(t testing.TB, name string, n int) {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	api := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS)
	for s := 0; s*1000 < n; s++ {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-" + strconv.Itoa(s), Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       webSlicePorts(),
		}
		for i := s * 1000; i < min(n, (s+1)*1000); i++ {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{BigServiceAddr(i)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true), Serving: ptrTo(true), Terminating: ptrTo(false)},
				NodeName:   ptrTo(OtherNode),
			})
		}
		if _, err := api.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating slice %s: %v", slice.Name, err)
		}
	}
	b.CreateService(t, name, nil)
}

// BigServiceAddr is the address of endpoint i of a BigService, in 10.246.0.0/16 (no pod has it).
func BigServiceAddr(i int) string {
	return "10.246." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1)
}

// PortName is "namespace/name:port", as kube-proxy spells a named Service port of the bed's namespace.
func (b *Bed) PortName(svc, port string) string { return b.NS + "/" + svc + ":" + port }

// NodePortOf returns the node port of a Service port by name, failing t when it has none.
func NodePortOf(t testing.TB, svc *corev1.Service, port string) int32 {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name == port && p.NodePort != 0 {
			return p.NodePort
		}
	}
	t.Fatalf("Service %s has no node port %q", svc.Name, port)
	return 0
}

// HostPort joins an address and a port.
func HostPort(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

func ptrTo[T any](v T) *T { return &v }
