package model

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
)

// TestRecorderFollowsTracker feeds a real Tracker and applies its snapshots, some skipped (so Changes
// has to compare maps): the recorder must find them consistent.
func TestRecorderFollowsTracker(t *testing.T) {
	tr := proxy.NewTracker(proxy.TrackerOptions{NodeName: "me", Families: []v1.IPFamily{v1.IPv4Protocol}})
	r := newRecorder(v1.IPv4Protocol)
	apply := func() {
		t.Helper()
		if err := r.Apply(context.Background(), tr.Snapshots().Snapshots[0], false); err != nil {
			t.Fatal(err)
		}
	}
	svc := func(name string, port int32) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, Ports: []v1.ServicePort{{Port: port, Protocol: v1.ProtocolTCP}}}}
	}
	es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a-1", Labels: map[string]string{discovery.LabelServiceName: "a"}},
		AddressType: discovery.AddressTypeIPv4, Ports: []discovery.EndpointPort{{Name: ref(""), Protocol: ref(v1.ProtocolTCP), Port: ref(int32(8080))}},
		Endpoints: []discovery.Endpoint{{Addresses: []string{"10.0.0.1"}}}}

	a, b := svc("a", 80), svc("b", 81)
	tr.OnService(nil, a)
	tr.OnService(nil, b)
	apply()
	tr.OnEndpointSlice(nil, es)
	apply()
	a2 := svc("a", 8000)
	tr.OnService(a, a2)
	tr.Snapshots() // built but never applied: the next one is not a direct successor of the last applied
	tr.OnService(b, nil)
	apply()
	tr.OnService(nil, b)
	apply()
	apply() // nothing changed
	if errs := r.Errors(); len(errs) > 0 {
		t.Fatalf("recorder found the tracker's snapshots inconsistent:\n%s", strings.Join(errs, "\n"))
	}
	if got := len(r.Latest().Services); got != 2 {
		t.Errorf("latest snapshot has %d ports, want 2", got)
	}
}

// TestRecorderCatchesViolations shows the recorder's checks can fail: a port changed in place, a
// generation going backwards, a snapshot of the wrong family, and a key that is not the port's name.
func TestRecorderCatchesViolations(t *testing.T) {
	name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}, Protocol: v1.ProtocolTCP}
	sp := &proxy.ServicePort{Name: name, Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80}
	snap := func(gen uint64, family v1.IPFamily) *proxy.Snapshot {
		return &proxy.Snapshot{Family: family, Generation: gen, Services: map[proxy.ServicePortName]*proxy.ServicePort{name: sp}}
	}
	r := newRecorder(v1.IPv4Protocol)
	ctx := context.Background()
	_ = r.Apply(ctx, snap(1, v1.IPv4Protocol), true)
	sp.Port = 81 // modified in place behind the dataplane's back
	_ = r.Apply(ctx, snap(2, v1.IPv4Protocol), false)
	_ = r.Apply(ctx, snap(1, v1.IPv4Protocol), false)
	_ = r.Apply(ctx, snap(3, v1.IPv6Protocol), false)
	errs := strings.Join(r.Errors(), "\n")
	for _, want := range []string{"modified in place", "generation did not increase", "snapshot of family IPv6"} {
		if !strings.Contains(errs, want) {
			t.Errorf("recorder errors lack %q:\n%s", want, errs)
		}
	}

	other := name
	other.Name = "b"
	bad := &proxy.Snapshot{Family: v1.IPv4Protocol, Generation: 1, Services: map[proxy.ServicePortName]*proxy.ServicePort{other: sp}}
	if _, problems := viewOf(bad); len(problems) != 1 {
		t.Errorf("viewOf found %d problems in a snapshot whose key is not its port's name, want 1", len(problems))
	}
}
