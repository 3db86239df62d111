package model

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// world writes objects through the admin client and remembers each as the API server returned it, so
// that expect can be computed from exactly what exists.
type world struct {
	client   kubernetes.Interface
	nodeName string

	mu       sync.Mutex
	node     *v1.Node
	services map[string]*v1.Service // "ns/name"
	slices   map[string]*discovery.EndpointSlice
}

func newWorld(client kubernetes.Interface, nodeName string) *world {
	return &world{client: client, nodeName: nodeName,
		services: map[string]*v1.Service{}, slices: map[string]*discovery.EndpointSlice{}}
}

func key(ns, name string) string { return ns + "/" + name }

// objects returns the current state for expect.
func (w *world) objects() *objects {
	w.mu.Lock()
	defer w.mu.Unlock()
	o := &objects{nodeName: w.nodeName, node: w.node}
	for _, s := range w.services {
		o.services = append(o.services, s)
	}
	for _, s := range w.slices {
		o.slices = append(o.slices, s)
	}
	return o
}

// service returns a copy of the stored Service (nil if absent), to modify and write back.
func (w *world) service(k string) *v1.Service {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.services[k]; s != nil {
		return s.DeepCopy()
	}
	return nil
}

// slice returns a copy of the stored slice (nil if absent).
func (w *world) slice(k string) *discovery.EndpointSlice {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.slices[k]; s != nil {
		return s.DeepCopy()
	}
	return nil
}

// slicesOf returns the keys of the stored slices labelled for Service k, sorted.
func (w *world) slicesOf(k string) []string {
	ns, name, _ := strings.Cut(k, "/")
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for sk, s := range w.slices {
		if s.Namespace == ns && s.Labels[discovery.LabelServiceName] == name {
			out = append(out, sk)
		}
	}
	slices.Sort(out)
	return out
}

func (w *world) createService(ctx context.Context, svc *v1.Service) error {
	got, err := w.client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	if len(svc.Status.LoadBalancer.Ingress) > 0 {
		got.Status = svc.Status
		if got, err = w.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting the status of Service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	}
	w.storeService(got)
	return nil
}

// updateService applies mutate to the stored Service and writes it (spec and labels; the status too when
// mutate changed it).
func (w *world) updateService(ctx context.Context, k string, mutate func(*v1.Service)) error {
	svc := w.service(k)
	if svc == nil {
		return fmt.Errorf("updating Service %s: not created by the test", k)
	}
	status := svc.Status.DeepCopy()
	mutate(svc)
	newStatus := svc.Status
	got, err := w.client.CoreV1().Services(svc.Namespace).Update(ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("updating Service %s: %w", k, err)
	}
	if !equalStatus(*status, newStatus) {
		got.Status = newStatus
		if got, err = w.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating the status of Service %s: %w", k, err)
		}
	}
	w.storeService(got)
	return nil
}

func equalStatus(a, b v1.ServiceStatus) bool {
	return fmt.Sprint(a.LoadBalancer.Ingress) == fmt.Sprint(b.LoadBalancer.Ingress)
}

func (w *world) deleteService(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	if err := w.client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting Service %s: %w", k, err)
	}
	w.mu.Lock()
	delete(w.services, k)
	w.mu.Unlock()
	return nil
}

func (w *world) storeService(s *v1.Service) {
	w.mu.Lock()
	w.services[key(s.Namespace, s.Name)] = s
	w.mu.Unlock()
}

// putSlice creates the slice, or replaces it when the test already wrote one of that name.
func (w *world) putSlice(ctx context.Context, es *discovery.EndpointSlice) error {
	k := key(es.Namespace, es.Name)
	var got *discovery.EndpointSlice
	var err error
	if old := w.slice(k); old != nil {
		es.ResourceVersion = old.ResourceVersion
		got, err = w.client.DiscoveryV1().EndpointSlices(es.Namespace).Update(ctx, es, metav1.UpdateOptions{})
	} else {
		got, err = w.client.DiscoveryV1().EndpointSlices(es.Namespace).Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing EndpointSlice %s: %w", k, err)
	}
	w.mu.Lock()
	w.slices[k] = got
	w.mu.Unlock()
	return nil
}

// updateSlice applies mutate to the stored slice and writes it.
func (w *world) updateSlice(ctx context.Context, k string, mutate func(*discovery.EndpointSlice)) error {
	es := w.slice(k)
	if es == nil {
		return fmt.Errorf("updating EndpointSlice %s: not created by the test", k)
	}
	mutate(es)
	stampTrigger(es)
	return w.putSlice(ctx, es)
}

func (w *world) deleteSlice(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	if err := w.client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting EndpointSlice %s: %w", k, err)
	}
	w.mu.Lock()
	delete(w.slices, k)
	w.mu.Unlock()
	return nil
}

// putNode creates or replaces the Node (spec, labels and status addresses).
func (w *world) putNode(ctx context.Context, node *v1.Node) error {
	nodes := w.client.CoreV1().Nodes()
	status := node.Status
	var got *v1.Node
	var err error
	w.mu.Lock()
	old := w.node
	w.mu.Unlock()
	if old != nil {
		node.ResourceVersion = old.ResourceVersion
		got, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
	} else {
		got, err = nodes.Create(ctx, node, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing Node %s: %w", node.Name, err)
	}
	got.Status = status
	if got, err = nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the status of Node %s: %w", node.Name, err)
	}
	w.mu.Lock()
	w.node = got
	w.mu.Unlock()
	return nil
}

func (w *world) deleteNode(ctx context.Context) error {
	w.mu.Lock()
	old := w.node
	w.mu.Unlock()
	if old == nil {
		return nil
	}
	if err := w.client.CoreV1().Nodes().Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting Node %s: %w", old.Name, err)
	}
	w.mu.Lock()
	w.node = nil
	w.mu.Unlock()
	return nil
}

// op is one API write of a batch.
type op func(ctx context.Context) error

// run executes ops with up to workers at a time and returns their errors joined. Ops of one batch must
// touch distinct objects (an op that needs an order does its writes itself).
func run(ctx context.Context, workers int, ops []op) error {
	ch := make(chan op)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range ch {
				if err := o(ctx); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, o := range ops {
		ch <- o
	}
	close(ch)
	wg.Wait()
	return errors.Join(errs...)
}

// stampTrigger sets the last-change-trigger-time annotation as the EndpointSlice controller would.
func stampTrigger(es *discovery.EndpointSlice) {
	if es.Annotations == nil {
		es.Annotations = map[string]string{}
	}
	es.Annotations[v1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
}
