package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// API is the part of the Kubernetes API that kube-proxy uses: the daemon lists and watches Services,
// EndpointSlices, its Node and the ServiceCIDRs, and creates Events about its node; the operator commands
// also ask for the server's version and what their user may do. An empty namespace means all namespaces.
//
// NewClient's implementation is a REST client over a scheme of just these API groups, not client-go's
// clientset: the clientset's package registers every API group Kubernetes has (apps, batch, resource,
// admission, ...) in a global scheme at start, which cost the daemon 20 MB of executable and about 9 MiB
// of resident memory for types it never decodes. Tests adapt a clientset with proxy/apitest.
type API interface {
	ListServices(ctx context.Context, namespace string, o metav1.ListOptions) (*v1.ServiceList, error)
	WatchServices(ctx context.Context, namespace string, o metav1.ListOptions) (watch.Interface, error)
	ListEndpointSlices(ctx context.Context, namespace string, o metav1.ListOptions) (*discovery.EndpointSliceList, error)
	WatchEndpointSlices(ctx context.Context, namespace string, o metav1.ListOptions) (watch.Interface, error)
	GetNode(ctx context.Context, name string) (*v1.Node, error)
	ListNodes(ctx context.Context, o metav1.ListOptions) (*v1.NodeList, error)
	WatchNodes(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
	ListServiceCIDRs(ctx context.Context, o metav1.ListOptions) (*networkingv1.ServiceCIDRList, error)
	WatchServiceCIDRs(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
	// ServerVersion returns the API server's /version.
	ServerVersion(ctx context.Context) (*version.Info, error)
	// ReviewAccess asks the API server whether the client's user may do what a names (a
	// SelfSubjectAccessReview).
	ReviewAccess(ctx context.Context, a authv1.ResourceAttributes) (bool, error)
	// CreateEvent creates an events.k8s.io/v1 Event in its namespace.
	CreateEvent(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error)
}

// apiScheme knows the types of the groups API uses, and the list options every group shares.
var (
	apiScheme = runtime.NewScheme()
	apiCodecs = serializer.NewCodecFactory(apiScheme)
	apiParams = runtime.NewParameterCodec(apiScheme)
)

func init() {
	utilruntime.Must(v1.AddToScheme(apiScheme))
	utilruntime.Must(discovery.AddToScheme(apiScheme))
	utilruntime.Must(networkingv1.AddToScheme(apiScheme))
	utilruntime.Must(authv1.AddToScheme(apiScheme))
	utilruntime.Must(eventsv1.AddToScheme(apiScheme))
	metav1.AddToGroupVersion(apiScheme, schema.GroupVersion{Version: "v1"})
}

// restAPI is API over one REST client per group, sharing one HTTP client and one rate limiter (as the
// clientset does).
type restAPI struct {
	core, discovery, networking, authz, events *rest.RESTClient
}

var _ API = (*restAPI)(nil)

// newRESTAPI returns the API client for a rest config.
func newRESTAPI(rc *rest.Config) (*restAPI, error) {
	c := *rc
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("clientConnection.burst must be positive when qps is (got %d)", c.Burst)
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, err
	}
	group := func(gv schema.GroupVersion, path string) (*rest.RESTClient, error) {
		gc := c
		gc.GroupVersion = &gv
		gc.APIPath = path
		gc.NegotiatedSerializer = apiCodecs.WithoutConversion()
		return rest.RESTClientForConfigAndClient(&gc, httpClient)
	}
	a := &restAPI{}
	for _, g := range []struct {
		into *(*rest.RESTClient)
		gv   schema.GroupVersion
		path string
	}{
		{&a.core, v1.SchemeGroupVersion, "/api"},
		{&a.discovery, discovery.SchemeGroupVersion, "/apis"},
		{&a.networking, networkingv1.SchemeGroupVersion, "/apis"},
		{&a.authz, authv1.SchemeGroupVersion, "/apis"},
		{&a.events, eventsv1.SchemeGroupVersion, "/apis"},
	} {
		if *g.into, err = group(g.gv, g.path); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// get starts a GET of resource in namespace ("" for all, or for a cluster-scoped resource), as client-go's
// generated clients make it: protobuf preferred unless the configuration names a content type.
func get(rc *rest.RESTClient, resource, namespace string, o *metav1.ListOptions) *rest.Request {
	var timeout time.Duration
	if o.TimeoutSeconds != nil {
		timeout = time.Duration(*o.TimeoutSeconds) * time.Second
	}
	return rc.Get().UseProtobufAsDefault().NamespaceIfScoped(namespace, namespace != "").Resource(resource).
		VersionedParams(o, apiParams).Timeout(timeout)
}

func list[L runtime.Object](ctx context.Context, rc *rest.RESTClient, resource, namespace string, o metav1.ListOptions, into L) (L, error) {
	err := get(rc, resource, namespace, &o).Do(ctx).Into(into)
	return into, err
}

func watchOf(ctx context.Context, rc *rest.RESTClient, resource, namespace string, o metav1.ListOptions) (watch.Interface, error) {
	o.Watch = true
	return get(rc, resource, namespace, &o).Watch(ctx)
}

func (a *restAPI) ListServices(ctx context.Context, ns string, o metav1.ListOptions) (*v1.ServiceList, error) {
	return list(ctx, a.core, "services", ns, o, &v1.ServiceList{})
}

func (a *restAPI) WatchServices(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return watchOf(ctx, a.core, "services", ns, o)
}

func (a *restAPI) ListEndpointSlices(ctx context.Context, ns string, o metav1.ListOptions) (*discovery.EndpointSliceList, error) {
	return list(ctx, a.discovery, "endpointslices", ns, o, &discovery.EndpointSliceList{})
}

func (a *restAPI) WatchEndpointSlices(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return watchOf(ctx, a.discovery, "endpointslices", ns, o)
}

func (a *restAPI) GetNode(ctx context.Context, name string) (*v1.Node, error) {
	out := &v1.Node{}
	err := a.core.Get().UseProtobufAsDefault().Resource("nodes").Name(name).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) ListNodes(ctx context.Context, o metav1.ListOptions) (*v1.NodeList, error) {
	return list(ctx, a.core, "nodes", "", o, &v1.NodeList{})
}

func (a *restAPI) WatchNodes(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return watchOf(ctx, a.core, "nodes", "", o)
}

func (a *restAPI) ListServiceCIDRs(ctx context.Context, o metav1.ListOptions) (*networkingv1.ServiceCIDRList, error) {
	return list(ctx, a.networking, "servicecidrs", "", o, &networkingv1.ServiceCIDRList{})
}

func (a *restAPI) WatchServiceCIDRs(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return watchOf(ctx, a.networking, "servicecidrs", "", o)
}

func (a *restAPI) ServerVersion(ctx context.Context) (*version.Info, error) {
	body, err := a.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("reading the server's version: %w", err)
	}
	return &info, nil
}

func (a *restAPI) ReviewAccess(ctx context.Context, attrs authv1.ResourceAttributes) (bool, error) {
	in := &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
	out := &authv1.SelfSubjectAccessReview{}
	err := a.authz.Post().UseProtobufAsDefault().Resource("selfsubjectaccessreviews").Body(in).Do(ctx).Into(out)
	if err != nil {
		return false, err
	}
	return out.Status.Allowed, nil
}

func (a *restAPI) CreateEvent(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	err := a.events.Post().UseProtobufAsDefault().Namespace(e.Namespace).Resource("events").Body(e).Do(ctx).Into(out)
	return out, err
}
