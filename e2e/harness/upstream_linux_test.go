package harness_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// TestUpstreamKubeProxyThroughTheBed runs upstream kube-proxy (iptables mode) in the node namespace
// against the shared cluster through the bridge, and checks that the bed carries real Service traffic:
// client -> ClusterIP reaches every pod, masqueraded (the pods see the node's address).
func TestUpstreamKubeProxyThroughTheBed(t *testing.T) {
	harness.RequireCluster(t, "iptables-restore")
	noNamespacesLeft(t)
	c := harness.SharedCluster(t)
	if second := harness.SharedCluster(t); second != c {
		t.Fatal("SharedCluster returned a different cluster on the second call")
	}
	bin, err := harness.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := c.Namespace(t, "upstream")
	nodeName := "node-" + ns

	topo := harness.TopologyForTest(t, harness.TopologyOptions{Pods: 2})
	if err := topo.StartServers(ctx, []int{8080}, []int{5353}); err != nil {
		t.Fatal(err)
	}

	node, err := c.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Admin.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: harness.NodeIP}}
	if _, err := c.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.Admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(5353)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var eps []discoveryv1.Endpoint
	for _, p := range topo.Pods {
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  []string{p.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)},
			NodeName:   ptrTo(nodeName),
		})
	}
	if _, err := c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptrTo("http"), Port: ptrTo[int32](8080), Protocol: ptrTo(corev1.ProtocolTCP)},
			{Name: ptrTo("dns"), Port: ptrTo[int32](5353), Protocol: ptrTo(corev1.ProtocolUDP)},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	kubeconfig := c.BridgeForTest(t, topo.Node)
	dir := t.TempDir()
	config := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
mode: iptables
clusterCIDR: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
iptables: {syncPeriod: 30s, minSyncPeriod: 0s}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, kubeconfig, nodeName, harness.PodCIDR)), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	kp, err := harness.StartProcess("upstream kube-proxy",
		topo.Node.Command(context.Background(), filepath.Join(bin, "kube-proxy"), "--config="+config, "--v=2"),
		filepath.Join(dir, "kube-proxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kp.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("kube-proxy log tail:\n%s", kp.LogTail(40))
		}
	})

	// Healthy (first sync done) according to its healthz, reached inside the node namespace.
	hc := topo.Node.HTTPClient()
	for {
		resp, err := hc.Get("http://127.0.0.1:10256/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if kp.Exited() || ctx.Err() != nil {
			t.Fatalf("kube-proxy never became healthy (exited %v)\n%s", kp.Exited(), kp.LogTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("upstream kube-proxy healthy after %v", time.Since(start).Round(time.Millisecond))

	for _, proto := range []struct{ network, port string }{{"tcp", "80"}, {"udp", "53"}} {
		addr := net.JoinHostPort(svc.Spec.ClusterIP, proto.port)
		res, err := harness.HitDetailed(ctx, topo.Client, proto.network, addr, 40)
		if err != nil {
			t.Fatal(err)
		}
		counts := harness.CountHits(res)
		if counts["pod1"]+counts["pod2"] != 40 || counts["pod1"] == 0 || counts["pod2"] == 0 {
			t.Errorf("client -> %s %s: %s, want 40 answers from both pods", proto.network, addr, harness.FormatHits(counts))
		}
		for _, r := range res {
			if r.Err == "" && !strings.HasPrefix(r.Seen, topo.PodByName(r.Pod).Gateway+":") {
				t.Errorf("client -> %s %s: %s saw %s, want the node's masqueraded address %s", proto.network, addr, r.Pod, r.Seen, topo.PodByName(r.Pod).Gateway)
				break
			}
		}
	}
	// Locally originated (node -> ClusterIP) through the service CIDR route.
	counts, err := harness.Hit(ctx, topo.Node, "tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), 20)
	if err != nil {
		t.Fatal(err)
	}
	if counts["pod1"]+counts["pod2"] != 20 {
		t.Errorf("node -> ClusterIP: %s, want 20 answers", harness.FormatHits(counts))
	}
}
