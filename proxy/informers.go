package proxy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Informer list/watch selectors, as upstream kube-proxy uses them.
var (
	// serviceSelector skips Services owned by another proxy; the field selector skips headless ones.
	serviceSelector = mustSelector(LabelServiceProxyName)
	// sliceSelector skips the slices of headless Services.
	sliceSelector = mustSelector(v1.IsHeadlessService)
)

func mustSelector(absentLabel string) string {
	r, err := labels.NewRequirement(absentLabel, selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*r).String()
}

// trim is the informers' transform: it keeps of each object only what the proxy reads (and what the
// informer itself needs: name, namespace, resourceVersion), so that the caches of large clusters hold a
// fraction of the API objects: no managedFields, no annotations (kubectl's last-applied-configuration can
// be kilobytes) except the trigger time, no owner references, no pod references in endpoints, no node
// images or conditions.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		o.ObjectMeta = trimMeta(o.ObjectMeta, "")
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discovery.EndpointSlice:
		o.ObjectMeta = trimMeta(o.ObjectMeta, AnnotationLastChangeTriggerTime)
		for i := range o.Endpoints {
			o.Endpoints[i].TargetRef = nil
			o.Endpoints[i].DeprecatedTopology = nil
			o.Endpoints[i].Hostname = nil
		}
	case *v1.Node:
		o.ObjectMeta = trimMeta(o.ObjectMeta, "")
		o.Status = v1.NodeStatus{Addresses: o.Status.Addresses}
		o.Spec = v1.NodeSpec{PodCIDR: o.Spec.PodCIDR, PodCIDRs: o.Spec.PodCIDRs, Taints: o.Spec.Taints}
	default:
		if a, err := meta.Accessor(obj); err == nil {
			a.SetManagedFields(nil)
		}
	}
	return obj, nil
}

// trimMeta keeps the identity, labels, deletion timestamp and one annotation (if named) of an object.
func trimMeta(m metav1.ObjectMeta, keepAnnotation string) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: m.Labels, DeletionTimestamp: m.DeletionTimestamp}
	if v, ok := m.Annotations[keepAnnotation]; ok && keepAnnotation != "" {
		out.Annotations = map[string]string{keepAnnotation: v}
	}
	return out
}

// WatchAPI starts watching Services, EndpointSlices and this node, feeding the Tracker. It blocks until
// each has been listed (logging while the API server is unreachable) or ctx is done; the watches keep
// running, and recover from API outages on their own (relisting when they must), until ctx is done.
//
// Services and EndpointSlices go through bare reflectors whose store is the Tracker itself (a feed): no
// informer cache keeps a second copy of every object, which at 10,000 Services was half the daemon's heap.
// The Tracker keeps only what it reads of the Services and what it parsed from the slices. Nothing here needs the
// informers' periodic resync: the Tracker ignores objects that did not change.
func (p *Proxy) WatchAPI(ctx context.Context, client API, resync time.Duration) error {
	t := p.tracker
	svcs := newFeed(func(s *v1.Service) { t.OnService(nil, s) }, func(s *v1.Service) { t.OnService(s, nil) },
		t.ReplaceServices)
	slices := newFeed(func(es *discovery.EndpointSlice) { t.OnEndpointSlice(nil, es) },
		func(es *discovery.EndpointSlice) { t.OnEndpointSlice(es, nil) }, t.ReplaceEndpointSlices)
	svcOpts := func(o *metav1.ListOptions) {
		o.LabelSelector = serviceSelector
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
	}
	svcLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			svcOpts(&o)
			return client.ListServices(ctx, metav1.NamespaceAll, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			svcOpts(&o)
			return client.WatchServices(ctx, metav1.NamespaceAll, o)
		},
	}
	sliceLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sliceSelector
			return client.ListEndpointSlices(ctx, metav1.NamespaceAll, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sliceSelector
			return client.WatchEndpointSlices(ctx, metav1.NamespaceAll, o)
		},
	}
	go cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(svcLW, client), &v1.Service{}, svcs,
		cache.ReflectorOptions{Name: "services", TypeDescription: "*v1.Service"}).RunWithContext(ctx)
	go cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(sliceLW, client), &discovery.EndpointSlice{}, slices,
		cache.ReflectorOptions{Name: "endpointslices", TypeDescription: "*v1.EndpointSlice"}).RunWithContext(ctx)

	// The node is one small object: a plain informer.
	thisNode := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.opts.NodeName).String()
	}
	nodeInformer := newInformer(client, &v1.Node{}, resync, &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			thisNode(&o)
			return client.ListNodes(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			thisNode(&o)
			return client.WatchNodes(ctx, o)
		},
	})
	if _, err := nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { t.OnNode(asNode(o)) },
		UpdateFunc: func(_, n any) { t.OnNode(asNode(n)) },
		DeleteFunc: func(any) { klog.InfoS("This node was deleted from the API", "node", p.opts.NodeName); t.OnNode(nil) },
	}); err != nil {
		return fmt.Errorf("adding Node handler: %w", err)
	}

	go nodeInformer.RunWithContext(ctx)
	if err := p.watchServiceCIDRs(ctx, client, resync); err != nil {
		return err
	}

	synced := []cache.InformerSynced{svcs.synced.Load, slices.synced.Load, nodeInformer.HasSynced}
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		done := true
		for _, s := range synced {
			done = done && s()
		}
		if done {
			klog.InfoS("API caches synced", "elapsed", time.Since(start).Round(time.Millisecond))
			if t.Node() == nil {
				klog.InfoS("This node is not (yet) known to the API server; /healthz fails until it is", "node", p.opts.NodeName)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			klog.InfoS("Still waiting for the API server to list Services, EndpointSlices and this Node", "waited", time.Since(start).Round(time.Second))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// watchServiceCIDRs feeds the CIDRs of the cluster's ServiceCIDR objects (networking.k8s.io/v1) to the
// Tracker: mode nftables drops traffic to unallocated addresses inside them, as upstream does. The few,
// small objects go through a plain informer; like upstream, the proxy does not wait for them to be listed.
func (p *Proxy) watchServiceCIDRs(ctx context.Context, client API, resync time.Duration) error {
	inf := newInformer(client, &networkingv1.ServiceCIDR{}, resync, &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.ListServiceCIDRs(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.WatchServiceCIDRs(ctx, o)
		},
	})
	var mu sync.Mutex
	byName := map[string][]string{}
	update := func(o any, deleted bool) {
		sc, ok := unwrap(o).(*networkingv1.ServiceCIDR)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if deleted {
			delete(byName, sc.Name)
		} else {
			byName[sc.Name] = sc.Spec.CIDRs
		}
		var all []string
		for _, cidrs := range byName {
			all = append(all, cidrs...)
		}
		p.tracker.OnServiceCIDRs(all)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { update(o, false) },
		UpdateFunc: func(_, o any) { update(o, false) },
		DeleteFunc: func(o any) { update(o, true) },
	}); err != nil {
		return fmt.Errorf("adding ServiceCIDR handler: %w", err)
	}
	go inf.RunWithContext(ctx)
	return nil
}

// newInformer returns an informer (not started) of the small object kinds, which keeps trimmed objects.
func newInformer(client API, obj runtime.Object, resync time.Duration, lw *cache.ListWatch) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), obj,
		cache.SharedIndexInformerOptions{ResyncPeriod: resync})
	if err := inf.SetTransform(trim); err != nil {
		panic(err) // fails only once an informer has started, and this one has not
	}
	return inf
}

// feed is a reflector's store that stores nothing: it trims each object and hands it to the Tracker.
type feed struct {
	set     func(obj any)    // added or updated
	del     func(obj any)    // deleted (its last state)
	replace func(list []any) // the whole list, after a (re)list
	synced  atomic.Bool      // listed at least once
}

var _ cache.TransformingStore = (*feed)(nil)

// newFeed returns a feed of objects of type T (anything else is ignored).
func newFeed[T any](set, del func(T), replace func([]T)) *feed {
	return &feed{
		set: func(o any) {
			if v, ok := o.(T); ok {
				set(v)
			}
		},
		del: func(o any) {
			if v, ok := unwrap(o).(T); ok {
				del(v)
			}
		},
		replace: func(list []any) {
			out := make([]T, 0, len(list))
			for _, o := range list {
				if v, ok := o.(T); ok {
					out = append(out, v)
				}
			}
			replace(out)
		},
	}
}

func (f *feed) Add(obj any) error {
	o, err := trim(obj)
	if err != nil {
		return err
	}
	f.set(o)
	return nil
}

func (f *feed) Update(obj any) error { return f.Add(obj) }

func (f *feed) Delete(obj any) error {
	f.del(obj)
	return nil
}

func (f *feed) Replace(list []any, _ string) error {
	for i, o := range list {
		t, err := trim(o)
		if err != nil {
			return err
		}
		list[i] = t
	}
	f.replace(list)
	f.synced.Store(true)
	return nil
}

// Resync is never called: the reflectors run without a resync period.
func (f *feed) Resync() error { return nil }

// Transformer lets a streaming list (WatchListClient) trim objects as they arrive, before it hands over
// the whole list.
func (f *feed) Transformer() cache.TransformFunc { return trim }

// The Node informer delivers tombstones on missed deletes; unwrap them.
func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

func asNode(o any) *v1.Node {
	n, _ := unwrap(o).(*v1.Node)
	return n
}
