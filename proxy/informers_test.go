package proxy

import (
	"context"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kube-proxy/proxy/apitest"
)

func TestTrimKeepsWhatTheProxyReads(t *testing.T) {
	now := metav1.Now()
	meta := metav1.ObjectMeta{Name: "web", Namespace: "ns", ResourceVersion: "7", UID: "u1",
		Labels:            map[string]string{"app": "web"},
		Annotations:       map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}", AnnotationLastChangeTriggerTime: "2026-12-02T10:00:00Z"},
		OwnerReferences:   []metav1.OwnerReference{{Name: "x"}},
		ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		DeletionTimestamp: &now,
	}
	svc := &v1.Service{ObjectMeta: meta, Spec: v1.ServiceSpec{ClusterIP: "10.0.0.1", Selector: map[string]string{"app": "web"},
		Ports: []v1.ServicePort{{Port: 80}}}, Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "1.2.3.4"}}}}}
	if _, err := trim(svc); err != nil {
		t.Fatal(err)
	}
	if svc.Name != "web" || svc.Namespace != "ns" || svc.ResourceVersion != "7" || svc.Labels["app"] != "web" ||
		svc.Spec.ClusterIP != "10.0.0.1" || len(svc.Spec.Ports) != 1 || len(svc.Status.LoadBalancer.Ingress) != 1 {
		t.Errorf("Service lost what the proxy reads: %+v", svc)
	}
	if svc.Annotations != nil || svc.ManagedFields != nil || svc.OwnerReferences != nil || svc.Spec.Selector != nil {
		t.Errorf("Service kept what the proxy never reads: %+v", svc.ObjectMeta)
	}

	node := "n1"
	es := &discovery.EndpointSlice{ObjectMeta: meta, Endpoints: []discovery.Endpoint{{Addresses: []string{"10.1.0.1"},
		NodeName: &node, TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "web-1"}}}}
	if _, err := trim(es); err != nil {
		t.Fatal(err)
	}
	if es.Annotations[AnnotationLastChangeTriggerTime] == "" || len(es.Annotations) != 1 {
		t.Errorf("slice annotations = %v, want only the trigger time", es.Annotations)
	}
	if es.Endpoints[0].TargetRef != nil || *es.Endpoints[0].NodeName != "n1" || es.Endpoints[0].Addresses[0] != "10.1.0.1" {
		t.Errorf("slice endpoint = %+v", es.Endpoints[0])
	}

	n := &v1.Node{ObjectMeta: meta, Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}, Taints: []v1.Taint{{Key: "k"}}, ProviderID: "x"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}},
			Images: []v1.ContainerImage{{Names: []string{"big"}}}, Conditions: []v1.NodeCondition{{Type: v1.NodeReady}}}}
	if _, err := trim(n); err != nil {
		t.Fatal(err)
	}
	if len(n.Status.Addresses) != 1 || n.Spec.PodCIDRs[0] != "10.244.1.0/24" || len(n.Spec.Taints) != 1 || n.DeletionTimestamp == nil {
		t.Errorf("Node lost what the proxy reads: %+v", n)
	}
	if n.Status.Images != nil || n.Status.Conditions != nil || n.Spec.ProviderID != "" {
		t.Errorf("Node kept what the proxy never reads")
	}
}

// TestWatchAPIFeedsTheTracker runs WatchAPI against a fake clientset: the initial list, then added, updated
// and deleted objects reach the snapshots, with no informer cache in between.
func TestWatchAPIFeedsTheTracker(t *testing.T) {
	web := webService()
	web.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	client := fake.NewClientset(web, webSlice("web-1", "10.1.0.1"),
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: thisNode, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}}})
	p := newTestProxy(t, time.Hour, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := p.WatchAPI(ctx, apitest.New(client), 0); err != nil {
		t.Fatal(err)
	}
	tr := p.Tracker()
	if tr.Node() == nil {
		t.Fatal("the node was not listed")
	}
	port := spn("ns", "web", "http", tcp)
	endpoints := func() []string {
		sp := tr.Snapshots().Snapshots[0].Services[port]
		if sp == nil {
			return nil
		}
		return epAddrs(sp.Endpoints)
	}
	if got := endpoints(); !slices.Equal(got, []string{"10.1.0.1:8080"}) {
		t.Fatalf("after the initial list: %v", got)
	}
	if tr.Node().ManagedFields != nil {
		t.Error("the Tracker holds an untrimmed Node")
	}

	waitFor := func(what string, want []string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := endpoints(); !slices.Equal(got, want); got = endpoints() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: endpoints %v, want %v", what, got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	slices2 := client.DiscoveryV1().EndpointSlices("ns")
	if _, err := slices2.Create(ctx, webSlice("web-2", "10.1.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a slice added", []string{"10.1.0.1:8080", "10.1.0.2:8080"})
	if _, err := slices2.Update(ctx, webSlice("web-1", "10.1.0.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a slice updated", []string{"10.1.0.2:8080", "10.1.0.3:8080"})
	if err := slices2.Delete(ctx, "web-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a slice deleted", []string{"10.1.0.3:8080"})
	if err := client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the Service deleted", nil)
}
