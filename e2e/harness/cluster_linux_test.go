package harness_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"

	"kube-proxy/e2e/harness"
)

// noNamespacesLeft registers, as the test's first cleanup (so it runs last), a check that the test
// left none of this process's network namespaces behind.
func noNamespacesLeft(t *testing.T) {
	t.Cleanup(func() {
		left, err := harness.OurNetNS()
		if err != nil {
			t.Errorf("listing network namespaces: %v", err)
		}
		if len(left) > 0 {
			t.Errorf("network namespaces left behind: %v", left)
		}
	})
}

// nodeProxierGrants is what user system:kube-proxy may do on resources, as "group/resource:verb":
// upstream's system:node-proxier (services, endpoints, nodes, events, servicecidrs, endpointslices)
// plus system:basic-user's self-reviews, which every authenticated user has.
var nodeProxierGrants = []string{
	"/endpoints:list", "/endpoints:watch",
	"/events:create", "/events:patch", "/events:update",
	"/nodes:get", "/nodes:list", "/nodes:watch",
	"/services:list", "/services:watch",
	"authentication.k8s.io/selfsubjectreviews:create",
	"authorization.k8s.io/selfsubjectaccessreviews:create",
	"authorization.k8s.io/selfsubjectrulesreviews:create",
	"discovery.k8s.io/endpointslices:list", "discovery.k8s.io/endpointslices:watch",
	"events.k8s.io/events:create", "events.k8s.io/events:patch", "events.k8s.io/events:update",
	"networking.k8s.io/servicecidrs:list", "networking.k8s.io/servicecidrs:watch",
}

func TestClusterRBACBridgeAndRestart(t *testing.T) {
	noNamespacesLeft(t)
	c := harness.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// As admin: a Service, its EndpointSlice and a Node (there is no controller-manager).
	svc, err := c.Admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service: %v", err)
	}
	_, svcNet, _ := net.ParseCIDR(harness.ServiceCIDR)
	if ip := net.ParseIP(svc.Spec.ClusterIP); ip == nil || !svcNet.Contains(ip) {
		t.Errorf("ClusterIP %q not in %s", svc.Spec.ClusterIP, harness.ServiceCIDR)
	}
	if _, err := c.Admin.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{harness.PodIP(1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)},
			NodeName:   ptrTo("node-a"),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo[int32](8080), Protocol: ptrTo(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating endpointslice: %v", err)
	}
	if _, err := c.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node: %v", err)
	}

	// As kube-proxy, from inside a network namespace through the bridge.
	ns := harness.NetNSForTest(t, "rbac")
	kubeconfig := c.BridgeForTest(t, ns)
	proxy, err := harness.ClientsetInNS(kubeconfig, ns)
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := proxy.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("kube-proxy listing services: %v", err)
	}
	if !hasName(svcs.Items, "web", func(s corev1.Service) string { return s.Name }) {
		t.Errorf("kube-proxy's service list lacks web: %d items", len(svcs.Items))
	}
	slices, err := proxy.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
	if err != nil {
		t.Fatalf("kube-proxy listing endpointslices: %v", err)
	}
	if len(slices.Items) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != harness.PodIP(1) {
		t.Errorf("kube-proxy's endpointslices = %+v, want web-1 with %s", slices.Items, harness.PodIP(1))
	}
	nodes, err := proxy.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("kube-proxy listing nodes: %v", err)
	}
	if !hasName(nodes.Items, "node-a", func(n corev1.Node) string { return n.Name }) {
		t.Errorf("kube-proxy's node list lacks node-a")
	}
	if _, err := proxy.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("kube-proxy getting its node: %v", err)
	}
	if _, err := proxy.CoreV1().Events("default").Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: "kp-"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"},
		Reason:         "Starting", Message: "harness test", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "kube-proxy", Host: "node-a"},
	}, metav1.CreateOptions{}); err != nil {
		t.Errorf("kube-proxy creating an event: %v", err)
	}

	// Forbidden: writing Services, reading Secrets and Pods.
	_, err = proxy.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "evil"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}},
	}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("kube-proxy creating a service: err = %v, want Forbidden", err)
	}
	if _, err := proxy.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kube-proxy listing secrets: err = %v, want Forbidden", err)
	}
	if _, err := proxy.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kube-proxy listing pods: err = %v, want Forbidden", err)
	}

	// Nothing more is granted: the rules the apiserver reports for the user are exactly these.
	review, err := proxy.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx,
		&authzv1.SelfSubjectRulesReview{Spec: authzv1.SelfSubjectRulesReviewSpec{Namespace: "default"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kube-proxy reviewing its rules: %v", err)
	}
	if review.Status.Incomplete {
		t.Errorf("rules review incomplete: %s", review.Status.EvaluationError)
	}
	if diff := cmp.Diff(nodeProxierGrants, grants(review.Status.ResourceRules)); diff != "" {
		t.Errorf("kube-proxy's resource grants (-want +got):\n%s", diff)
	}

	// A process inside the namespace reaches the apiserver through the bridge too.
	cert, key, err := c.ClientCert(harness.UserKubeProxy)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ns.Run(ctx, "curl", "-sS", "--max-time", "10", "--cacert", c.CAFile, "--cert", cert, "--key", key,
		"https://"+harness.BridgeAddr+"/version")
	if err != nil || !strings.Contains(out, `"gitVersion": "v1.37.2"`) {
		t.Errorf("curl /version inside %s: %v\n%s", ns.Name, err, out)
	}

	// A watch-based client survives an apiserver restart.
	factory := informers.NewSharedInformerFactory(proxy, 0)
	svcInformer := factory.Core().V1().Services().Informer()
	stopCh := make(chan struct{})
	defer func() { close(stopCh); factory.Shutdown() }()
	factory.Start(stopCh)
	if !waitSynced(ctx, svcInformer.HasSynced) {
		t.Fatal("service informer did not sync")
	}
	start := time.Now()
	if err := c.StopAPIServer(); err != nil {
		t.Fatalf("stopping apiserver: %v", err)
	}
	t.Logf("apiserver stopped in %v", time.Since(start).Round(time.Millisecond))
	listStart := time.Now()
	outageCtx, outageCancel := context.WithTimeout(ctx, 3*time.Second) // client-go retries for ~10 s
	defer outageCancel()
	if _, err := proxy.CoreV1().Services("default").List(outageCtx, metav1.ListOptions{}); err == nil {
		t.Error("listing services with the apiserver stopped succeeded")
	} else {
		t.Logf("listing during the outage failed after %v: %v", time.Since(listStart).Round(time.Millisecond), err)
	}
	start = time.Now()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatalf("restarting apiserver: %v\n%s", err, c.LogTail(30))
	}
	t.Logf("apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
	if _, err := c.Admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "after-restart"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 81, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating service after restart: %v", err)
	}
	start = time.Now()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, ok, _ := svcInformer.GetStore().GetByKey("default/after-restart"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kube-proxy user's informer never saw the service created after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("informer saw the new service %v after its creation", time.Since(start).Round(time.Millisecond))
	svcs, err = proxy.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil || !hasName(svcs.Items, "after-restart", func(s corev1.Service) string { return s.Name }) {
		t.Errorf("listing after restart: err=%v", err)
	}
}

// grants expands resource rules to sorted "group/resource:verb" strings.
func grants(rules []authzv1.ResourceRule) []string {
	set := map[string]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					s := fmt.Sprintf("%s/%s:%s", g, res, v)
					if len(r.ResourceNames) > 0 {
						s += fmt.Sprintf("%v", r.ResourceNames)
					}
					set[s] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func hasName[T any](items []T, name string, nameOf func(T) string) bool {
	for _, it := range items {
		if nameOf(it) == name {
			return true
		}
	}
	return false
}

func waitSynced(ctx context.Context, synced func() bool) bool {
	for !synced() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

func ptrTo[T any](v T) *T { return &v }

func TestDualStackCluster(t *testing.T) {
	harness.RequireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := harness.StartClusterWith(ctx, t.TempDir(), harness.ClusterOptions{
		ServiceCIDRs: harness.ServiceCIDR + "," + harness.ServiceCIDRv6,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
		if err := c.Stop(); err != nil { // idempotent
			t.Errorf("second Stop: %v", err)
		}
	})
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := c.Admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: &policy,
			Ports:          []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a dual-stack service: %v", err)
	}
	_, v6, _ := net.ParseCIDR(harness.ServiceCIDRv6)
	if len(svc.Spec.ClusterIPs) != 2 || !v6.Contains(net.ParseIP(svc.Spec.ClusterIPs[1])) {
		t.Errorf("ClusterIPs = %v, want an IPv4 and an IPv6 from %s", svc.Spec.ClusterIPs, harness.ServiceCIDRv6)
	}
}
