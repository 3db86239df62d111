package iptables

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// The ports the pod servers answer on, and the Service ports in front of them.
const (
	podTCP = 8080
	podUDP = 5353
	svcTCP = 80
	svcUDP = 53
)

// Topology facts the tests give the node and the endpoints.
const (
	otherNode = "node-elsewhere" // endpoints "on another node" (the pods are all wired to ours)
	zoneHere  = "zone-a"         // our node's zone
	zoneThere = "zone-b"
)

// baseConfig is the daemon configuration every test starts from: pods are in PodCIDR (so traffic from
// outside it is masqueraded), and syncs are not delayed.
const baseConfig = "mode: iptables\nclusterCIDR: " + harness.PodCIDR + "\n"

// syncConfig is the iptables section of most tests: partial syncs at once, a full one every 30 s.
const syncConfig = "iptables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n"

// bed is one test's world: a node namespace with pods and a client, a Kubernetes namespace and Node of its
// own in the shared cluster, and the iptables backend the daemon is steered to.
type bed struct {
	t    *testing.T
	c    *harness.Cluster
	topo *harness.Topology
	xt   *harness.XTables
	ns   string // Kubernetes namespace of the test's Services
	node string // Node name the daemon runs as
	d    *harness.Daemon
	// kubeconfig reaches the apiserver from inside the node namespace, through one bridge shared by every
	// daemon the test starts there.
	kubeconfig string
}

// newBed builds a bed with pods pod namespaces serving podTCP and podUDP, a Node object in zoneHere, and a
// KUBE-IPTABLES-HINT chain in the mangle table of backend so that the daemon picks that backend.
func newBed(t *testing.T, backend string, pods int) *bed {
	t.Helper()
	harness.RequireCluster(t, "iptables-nft", "iptables-legacy", "iptables-nft-save", "iptables-legacy-save")
	c := harness.SharedCluster(t)
	b := &bed{t: t, c: c}
	b.ns = c.Namespace(t, "ipt")
	b.node = "node-" + b.ns
	harness.EnsureNode(t, c, b.node, harness.NodeIP, "", map[string]string{
		corev1.LabelTopologyZone: zoneHere, corev1.LabelHostname: b.node})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Admin.CoreV1().Nodes().Delete(ctx, b.node, metav1.DeleteOptions{})
	})
	// Nothing garbage-collects a namespace's objects without a controller-manager: delete them, so that the
	// daemons of later tests do not program them.
	t.Cleanup(b.deleteObjects)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.topo = harness.TopologyForTest(t, harness.TopologyOptions{Pods: pods})
	if err := b.topo.StartServers(ctx, []int{podTCP}, []int{podUDP}); err != nil {
		t.Fatal(err)
	}
	// The client's packets to cluster IPs leave the node by the interface they came in on (the bed routes
	// the service CIDR towards eth0), so the node would answer the first ones with ICMP redirects, which
	// share the per-host ICMP rate limit with the port-unreachable errors REJECT sends: the client would
	// then see timeouts where upstream's rules REJECT. A real client is not routed like that. The per-host
	// limit itself (a burst of 6, then 1/s) is lifted too, so that a test may probe a REJECT more often.
	if err := b.topo.Node.Sysctl(ctx, "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0",
		"net.ipv4.icmp_ratelimit=0"); err != nil {
		t.Fatal(err)
	}
	b.kubeconfig = c.BridgeForTest(t, b.topo.Node)
	xt, err := harness.NewXTables(b.topo.Node, backend, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.xt = xt
	if err := xt.SetHint(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bed) deleteObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.c.Admin.DiscoveryV1().EndpointSlices(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	svcs, err := b.c.Admin.CoreV1().Services(b.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, s := range svcs.Items {
		_ = b.c.Admin.CoreV1().Services(b.ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
	}
}

// start starts our daemon in the node namespace with baseConfig plus extra, and waits for READY=1 (its
// first sync done). Every daemon gets the test's private xtables lock file.
func (b *bed) start(extra string) *harness.Daemon {
	b.t.Helper()
	if extra == "" {
		extra = syncConfig
	}
	started := time.Now()
	b.d = harness.StartDaemon(b.t, b.c, b.topo.Node, harness.DaemonOptions{
		NodeName:   b.node,
		Config:     baseConfig + extra,
		Env:        []string{b.xt.Env()},
		Kubeconfig: b.kubeconfig,
	})
	b.t.Logf("kube-proxy (%s) ready %v after start", b.xt.Backend, time.Since(started).Round(time.Millisecond))
	return b.d
}

func (b *bed) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// webPorts are a Service's usual ports: "tcp" 80 -> podTCP and "udp" 53 -> podUDP.
func webPorts() []corev1.ServicePort {
	return []corev1.ServicePort{
		{Name: "tcp", Port: svcTCP, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(podTCP)},
		{Name: "udp", Port: svcUDP, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(podUDP)},
	}
}

// createService creates a ClusterIP Service with webPorts, changed by mutate, and returns it as stored
// (cluster IP and node ports allocated).
func (b *bed) createService(t testing.TB, name string, mutate func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: webPorts()},
	}
	if mutate != nil {
		mutate(svc)
	}
	ctx, cancel := b.ctx()
	defer cancel()
	out, err := b.c.Admin.CoreV1().Services(b.ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	return out
}

func (b *bed) deleteService(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := b.ctx()
	defer cancel()
	if err := b.c.Admin.CoreV1().Services(b.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting Service %s: %v", name, err)
	}
	err := b.c.Admin.DiscoveryV1().EndpointSlices(b.ns).Delete(ctx, name+"-slice", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting EndpointSlice of %s: %v", name, err)
	}
}

// ep is one endpoint of an EndpointSlice: a pod of the bed, on our node unless node says otherwise.
type ep struct {
	pod                         int
	node                        string
	ready, serving, terminating bool
	zones                       []string
}

// readyEP is a ready endpoint on our node.
func readyEP(pod int) ep { return ep{pod: pod, ready: true, serving: true} }

// remoteEP is a ready endpoint on another node.
func remoteEP(pod int) ep { return ep{pod: pod, node: otherNode, ready: true, serving: true} }

// setEndpoints creates or replaces the one EndpointSlice of Service svc, with ports "tcp" (podTCP) and
// "udp" (podUDP).
func (b *bed) setEndpoints(t testing.TB, svc string, eps ...ep) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-slice", Namespace: b.ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("tcp"), Port: ptr[int32](podTCP), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr("udp"), Port: ptr[int32](podUDP), Protocol: ptr(corev1.ProtocolUDP)},
		},
		Endpoints: []discoveryv1.Endpoint{},
	}
	for _, e := range eps {
		node := e.node
		if node == "" {
			node = b.node
		}
		de := discoveryv1.Endpoint{
			Addresses: []string{harness.PodIP(e.pod)},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr(e.ready), Serving: ptr(e.serving), Terminating: ptr(e.terminating)},
			NodeName: ptr(node),
		}
		if len(e.zones) > 0 {
			de.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.zones {
				de.Hints.ForZones = append(de.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		slice.Endpoints = append(slice.Endpoints, de)
	}
	ctx, cancel := b.ctx()
	defer cancel()
	api := b.c.Admin.DiscoveryV1().EndpointSlices(b.ns)
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

func ptr[T any](v T) *T { return &v }

// nodePort returns the node port of a Service port by name.
func nodePort(t testing.TB, svc *corev1.Service, port string) int32 {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name == port && p.NodePort != 0 {
			return p.NodePort
		}
	}
	t.Fatalf("Service %s has no node port %q", svc.Name, port)
	return 0
}

// hostPort joins an address and a port.
func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

// save returns iptables-save of one table (IPv4) in the bed's backend, parsed.
func (b *bed) save(t testing.TB, table string) *harness.SavedTable {
	t.Helper()
	return saveTable(t, b.xt, false, table)
}

func saveTable(t testing.TB, xt *harness.XTables, ipv6 bool, table string) *harness.SavedTable {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := xt.Save(ctx, ipv6, table)
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	tab := harness.ParseSave(out)[table]
	if tab == nil {
		return &harness.SavedTable{Chains: map[string]string{}}
	}
	return tab
}

// hashName is upstream's chain naming, written here independently of the daemon's code:
// prefix-<first 16 characters of base32(sha256(parts))>.
func hashName(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return prefix + "-" + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// portName is "ns/name:port" as upstream spells a named Service port.
func (b *bed) portName(svc, port string) string { return b.ns + "/" + svc + ":" + port }

// svcChain returns the KUBE-SVC/SVL/EXT/FW chain of a Service port ("tcp" or "udp"; the protocol is the
// port's name).
func (b *bed) svcChain(prefix, svc, port string) string {
	return hashName(prefix, b.portName(svc, port), port)
}

// sepChain returns the KUBE-SEP chain of pod i behind a Service port.
func (b *bed) sepChain(svc, port string, pod int) string {
	target := podTCP
	if port == "udp" {
		target = podUDP
	}
	return hashName("KUBE-SEP", b.portName(svc, port), port, net.JoinHostPort(harness.PodIP(pod), strconv.Itoa(target)))
}

// eventually polls cond every 100 ms until it holds, failing t after timeout with cond's last detail.
func eventually(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, detail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitChains waits until every chain in present exists and none in absent does, in the nat table.
func (b *bed) waitChains(t testing.TB, present, absent []string) {
	t.Helper()
	eventually(t, "nat chains", 30*time.Second, func() (bool, string) {
		nat := b.save(t, "nat")
		for _, c := range present {
			if _, ok := nat.Chains[c]; !ok {
				return false, c + " missing"
			}
		}
		for _, c := range absent {
			if _, ok := nat.Chains[c]; ok {
				return false, c + " still there"
			}
		}
		return true, ""
	})
}

// hit makes n connections (datagrams for UDP) from ns to addr.
func hit(t testing.TB, from *harness.NetNS, network, addr string, n int, opts harness.HitOptions) []harness.HitResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := harness.HitWith(ctx, from, network, addr, n, opts)
	if err != nil {
		t.Fatalf("hit %s %s: %v", network, addr, err)
	}
	return res
}

// expectSpread checks that every connection was answered, by the pods in want only, each at least once, and
// that each pod saw the source address seen(pod) ("" skips that check).
func expectSpread(t testing.TB, label string, res []harness.HitResult, want []string, seen func(pod string) string) {
	t.Helper()
	counts := harness.CountHits(res)
	var bad []string
	for k, n := range counts {
		if !slices.Contains(want, k) && n > 0 {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	for _, p := range want {
		if counts[p] == 0 {
			bad = append(bad, "no "+p)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: %s; want answers from %v only (%s)", label, harness.FormatHits(counts), want, strings.Join(bad, ", "))
	}
	if seen == nil {
		return
	}
	for _, r := range res {
		if r.Err != "" {
			continue
		}
		host, _, _ := net.SplitHostPort(r.Seen)
		if w := seen(r.Pod); w != "" && host != w {
			t.Errorf("%s: %s saw the client as %s, want %s", label, r.Pod, host, w)
			return
		}
	}
}

// expectAllErr checks that every connection failed with class.
func expectAllErr(t testing.TB, label string, res []harness.HitResult, class string) {
	t.Helper()
	counts := harness.CountHits(res)
	if counts["ERR:"+class] != len(res) {
		t.Errorf("%s: %s; want every one to fail with %q", label, harness.FormatHits(counts), class)
	}
}

// podNames returns "pod<i>" for each i.
func podNames(pods ...int) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = "pod" + strconv.Itoa(p)
	}
	return out
}

// gatewayOf returns the node's address on a pod's link: what the pod sees when the node masqueraded.
func gatewayOf(pod string) string {
	i, _ := strconv.Atoi(strings.TrimPrefix(pod, "pod"))
	return harness.PodGatewayIP(i)
}

// metric returns the value of the first sample of name whose labels contain every one of labels
// (`key="value"`), from a /metrics body.
func metric(body, name string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		return v, err == nil
	}
	return 0, false
}

// metrics fetches the daemon's /metrics.
func metrics(t testing.TB, d *harness.Daemon) string {
	t.Helper()
	code, body, err := d.Get(10249, "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return body
}

// kubeChains lists the chains named KUBE-* of every table and both families in one backend, as
// "family/table/chain".
func kubeChains(t testing.TB, xt *harness.XTables) []string {
	t.Helper()
	var out []string
	for _, ipv6 := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := xt.Save(ctx, ipv6, "")
		cancel()
		if err != nil {
			t.Fatalf("iptables-save: %v", err)
		}
		fam := "IPv4"
		if ipv6 {
			fam = "IPv6"
		}
		for table, tab := range harness.ParseSave(s) {
			for _, c := range tab.ChainNames("KUBE-") {
				out = append(out, fmt.Sprintf("%s/%s/%s", fam, table, c))
			}
		}
	}
	sort.Strings(out)
	return out
}
