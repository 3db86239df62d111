package proxy

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
