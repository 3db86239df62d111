// Package apitest adapts a client-go clientset (a fake one, or a real one in end-to-end tests) to proxy.API.
// It is for tests only: the daemon must not import it, since the clientset's package registers every API
// group in a global scheme.
package apitest

import (
	"context"

	authv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Clientset is a clientset seen as a proxy.API.
type Clientset struct{ kubernetes.Interface }

// New adapts cs.
func New(cs kubernetes.Interface) *Clientset { return &Clientset{cs} }

func (c *Clientset) ListServices(ctx context.Context, ns string, o metav1.ListOptions) (*v1.ServiceList, error) {
	return c.CoreV1().Services(ns).List(ctx, o)
}

func (c *Clientset) WatchServices(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Services(ns).Watch(ctx, o)
}

func (c *Clientset) ListEndpointSlices(ctx context.Context, ns string, o metav1.ListOptions) (*discovery.EndpointSliceList, error) {
	return c.DiscoveryV1().EndpointSlices(ns).List(ctx, o)
}

func (c *Clientset) WatchEndpointSlices(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return c.DiscoveryV1().EndpointSlices(ns).Watch(ctx, o)
}

func (c *Clientset) GetNode(ctx context.Context, name string) (*v1.Node, error) {
	return c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (c *Clientset) ListNodes(ctx context.Context, o metav1.ListOptions) (*v1.NodeList, error) {
	return c.CoreV1().Nodes().List(ctx, o)
}

func (c *Clientset) WatchNodes(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Nodes().Watch(ctx, o)
}

func (c *Clientset) ListServiceCIDRs(ctx context.Context, o metav1.ListOptions) (*networkingv1.ServiceCIDRList, error) {
	return c.NetworkingV1().ServiceCIDRs().List(ctx, o)
}

func (c *Clientset) WatchServiceCIDRs(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return c.NetworkingV1().ServiceCIDRs().Watch(ctx, o)
}

func (c *Clientset) ServerVersion(context.Context) (*version.Info, error) {
	return c.Discovery().ServerVersion()
}

func (c *Clientset) ReviewAccess(ctx context.Context, a authv1.ResourceAttributes) (bool, error) {
	r, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
		&authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return r.Status.Allowed, nil
}

func (c *Clientset) CreateEvent(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return c.EventsV1().Events(e.Namespace).Create(ctx, e, metav1.CreateOptions{})
}

// IsWatchListSemanticsUnSupported tells reflectors whether the clientset can stream lists (fake ones
// cannot), as the clientset itself would.
func (c *Clientset) IsWatchListSemanticsUnSupported() bool {
	u, ok := c.Interface.(interface{ IsWatchListSemanticsUnSupported() bool })
	return ok && u.IsWatchListSemanticsUnSupported()
}
