package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// apiFixture is an API server that answers each "METHOD /path?query" in replies with an object, encoded as
// the client asked (protobuf by default), and fails every other request. Watches get one ADDED event.
type apiFixture struct {
	t       *testing.T
	replies map[string]runtime.Object
	bodies  []runtime.Object // decoded request bodies
	accepts []string
}

func (f *apiFixture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		key += "?" + r.URL.RawQuery
	}
	f.accepts = append(f.accepts, r.Header.Get("Accept"))
	obj, ok := f.replies[key]
	if !ok {
		f.t.Errorf("unexpected request %s", key)
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if r.Body != nil && r.Method == http.MethodPost {
		body, _ := io.ReadAll(r.Body)
		in, _, err := apiCodecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			f.t.Errorf("%s: decoding the body: %v", key, err)
		}
		f.bodies = append(f.bodies, in)
	}
	if v, ok := obj.(*versionReply); ok {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, v.json)
		return
	}
	if r.URL.Query().Get("watch") == "true" {
		// Watch streams: JSON events, one object.
		enc := apiCodecs.LegacyCodec(v1.SchemeGroupVersion, networkingv1.SchemeGroupVersion)
		objJSON, err := runtime.Encode(enc, obj)
		if err != nil {
			f.t.Fatal(err)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", objJSON)
		return
	}
	info, ok := runtime.SerializerInfoForMediaType(apiCodecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok || !strings.Contains(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) {
		f.t.Errorf("%s: Accept %q, want protobuf", key, r.Header.Get("Accept"))
		info, _ = runtime.SerializerInfoForMediaType(apiCodecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	}
	gvks, _, err := apiScheme.ObjectKinds(obj)
	if err != nil {
		f.t.Fatal(err)
	}
	body, err := runtime.Encode(apiCodecs.EncoderForVersion(info.Serializer, gvks[0].GroupVersion()), obj)
	if err != nil {
		f.t.Fatal(err)
	}
	w.Header().Set("Content-Type", info.MediaType)
	w.Write(body)
}

// versionReply stands for a /version answer (plain JSON, no kind).
type versionReply struct {
	runtime.Object
	json string
}

// TestRESTAPI checks each call of the daemon's API client against the paths, query parameters and
// encodings of the real API: protobuf requested and decoded, selectors and watch parameters passed,
// namespaced and cluster-scoped resources in their places, and request bodies encoded.
func TestRESTAPI(t *testing.T) {
	sel := "service.kubernetes.io%2Fservice-proxy-name"
	f := &apiFixture{t: t, replies: map[string]runtime.Object{
		"GET /api/v1/services?fieldSelector=spec.clusterIP%21%3DNone&labelSelector=%21" + sel: &v1.ServiceList{
			ListMeta: metav1.ListMeta{ResourceVersion: "7"},
			Items: []v1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
				Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}}},
		"GET /apis/discovery.k8s.io/v1/namespaces/ns/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb": &discovery.EndpointSliceList{
			Items: []discovery.EndpointSlice{{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "ns"}, AddressType: discovery.AddressTypeIPv4,
				Endpoints: []discovery.Endpoint{{Addresses: []string{"10.1.0.1"}}}}}},
		"GET /api/v1/nodes/node-a": &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.1"}}}},
		"GET /api/v1/nodes?allowWatchBookmarks=true&fieldSelector=metadata.name%3Dnode-a&resourceVersion=5&watch=true": &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "6"}},
		"GET /apis/networking.k8s.io/v1/servicecidrs": &networkingv1.ServiceCIDRList{
			Items: []networkingv1.ServiceCIDR{{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}},
		"GET /version": &versionReply{json: `{"major":"1","minor":"37","gitVersion":"v1.37.2"}`},
		"POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews": &authv1.SelfSubjectAccessReview{
			Status: authv1.SubjectAccessReviewStatus{Allowed: true}},
		"POST /apis/events.k8s.io/v1/namespaces/default/events": &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a.1", Namespace: "default", ResourceVersion: "9"}},
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	cc := (&rest.Config{Host: srv.URL, QPS: 5, Burst: 10})
	api, err := newRESTAPI(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	svcs, err := api.ListServices(ctx, "", metav1.ListOptions{LabelSelector: serviceSelector, FieldSelector: "spec.clusterIP!=None"})
	if err != nil || len(svcs.Items) != 1 || svcs.Items[0].Spec.ClusterIP != "10.96.0.10" || svcs.ResourceVersion != "7" {
		t.Errorf("ListServices = %+v, %v", svcs, err)
	}
	slices, err := api.ListEndpointSlices(ctx, "ns", metav1.ListOptions{LabelSelector: discovery.LabelServiceName + "=web"})
	if err != nil || len(slices.Items) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != "10.1.0.1" {
		t.Errorf("ListEndpointSlices = %+v, %v", slices, err)
	}
	node, err := api.GetNode(ctx, "node-a")
	if err != nil || node.Name != "node-a" || node.Status.Addresses[0].Address != "192.168.0.1" {
		t.Errorf("GetNode = %+v, %v", node, err)
	}
	w, err := api.WatchNodes(ctx, metav1.ListOptions{FieldSelector: "metadata.name=node-a", ResourceVersion: "5", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatalf("WatchNodes: %v", err)
	}
	select {
	case ev := <-w.ResultChan():
		if n, ok := ev.Object.(*v1.Node); ev.Type != watch.Added || !ok || n.ResourceVersion != "6" {
			t.Errorf("watch event %v %#v", ev.Type, ev.Object)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	w.Stop()
	cidrs, err := api.ListServiceCIDRs(ctx, metav1.ListOptions{})
	if err != nil || len(cidrs.Items) != 1 || cidrs.Items[0].Spec.CIDRs[0] != "10.96.0.0/16" {
		t.Errorf("ListServiceCIDRs = %+v, %v", cidrs, err)
	}
	v, err := api.ServerVersion(ctx)
	if err != nil || v.GitVersion != "v1.37.2" {
		t.Errorf("ServerVersion = %+v, %v", v, err)
	}
	allowed, err := api.ReviewAccess(ctx, authv1.ResourceAttributes{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"})
	if err != nil || !allowed {
		t.Errorf("ReviewAccess = %v, %v", allowed, err)
	}
	ev, err := api.CreateEvent(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "node-a.1", Namespace: "default"},
		Reason: "Starting", Regarding: v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "node-a"}})
	if err != nil || ev.ResourceVersion != "9" {
		t.Errorf("CreateEvent = %+v, %v", ev, err)
	}
	if len(f.bodies) != 2 {
		t.Fatalf("request bodies: %v", f.bodies)
	}
	if r, ok := f.bodies[0].(*authv1.SelfSubjectAccessReview); !ok || r.Spec.ResourceAttributes == nil ||
		r.Spec.ResourceAttributes.Resource != "endpointslices" || r.Spec.ResourceAttributes.Verb != "watch" {
		t.Errorf("access review sent: %#v", f.bodies[0])
	}
	if e, ok := f.bodies[1].(*eventsv1.Event); !ok || e.Reason != "Starting" || e.Regarding.Name != "node-a" {
		t.Errorf("event sent: %#v", f.bodies[1])
	}
}

// TestRESTAPIRejectsBurstlessQPS: a rate without a burst is a configuration error, said as such.
func TestRESTAPIRejectsBurstlessQPS(t *testing.T) {
	_, err := newRESTAPI(&rest.Config{Host: "http://127.0.0.1:1", QPS: 5})
	if err == nil || !strings.Contains(err.Error(), "burst") {
		t.Errorf("err = %v, want one naming the burst", err)
	}
}
