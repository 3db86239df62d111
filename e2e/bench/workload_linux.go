package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"kube-proxy/e2e/harness"
)

// The benchmark's Services: ClusterIP, one TCP port named "http" (80 → 8080), in one namespace.
const (
	benchNS   = "bench"
	portName  = "http"
	svcPort   = 80
	podPort   = 8080
	nodeName  = "node-bench"
	sinkRange = "10.244.128.0/17" // every endpoint address: local in the sink pod, routed there by the node
)

func endpointIP(k, firstBlock, blocks int) string {
	k %= blocks * 254
	return fmt.Sprintf("10.244.%d.%d", 128+firstBlock+k/254, k%254+1)
}

func origEndpoint(k int) string  { return endpointIP(k, 0, origBlocks) }
func extraEndpoint(k int) string { return endpointIP(k, origBlocks, extraBlocks) }

// service is one benchmark Service as the API has it.
type service struct {
	Name      string
	ClusterIP string
	Chain     string // its KUBE-SVC chain
	NFTChain  string // its chain in mode nftables
	slice     *discoveryv1.EndpointSlice
	// Endpoints are the original endpoint addresses ("ip:port"), sorted.
	Endpoints []string
}

// workload creates and changes the benchmark's Services.
type workload struct {
	cs   kubernetes.Interface
	m    int
	svcs []*service
}

// newWorkload returns a workload of Services with m endpoints each, in a fresh cluster, with the
// benchmark's namespace and Node created. Client-side rate limits are off.
func newWorkload(ctx context.Context, c *harness.Cluster, m int) (*workload, error) {
	rc, err := c.RESTConfig(harness.UserAdmin)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = -1, 0 // no client-side rate limiting
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", benchNS, err)
	}
	if err := harness.ApplyNode(ctx, c, nodeName, harness.NodeIP, harness.PodCIDR, nil); err != nil {
		return nil, err
	}
	return &workload{cs: cs, m: m}, nil
}

// grow creates Services up to n in total, with workers in parallel, the first of all (index 0) alone
// before the others and the last one (n-1) alone after them, so that "first-created" and "last-created"
// are well defined. It returns how long the creation took.
func (w *workload) grow(ctx context.Context, n, workers int) (time.Duration, error) {
	start := time.Now()
	from := len(w.svcs)
	if n <= from {
		return 0, nil
	}
	w.svcs = append(w.svcs, make([]*service, n-from)...)
	if from == 0 {
		if err := w.create(ctx, 0); err != nil {
			return 0, err
		}
		from = 1
	}
	if err := parallel(ctx, workers, from, n-1, w.create); err != nil {
		return 0, err
	}
	if n-1 >= from {
		if err := w.create(ctx, n-1); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// parallel runs fn(i) for i in [from, to) with workers goroutines and returns the first error.
func parallel(ctx context.Context, workers, from, to int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for i := from; i < to; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

func (w *workload) create(ctx context.Context, i int) error {
	name := fmt.Sprintf("svc-%05d", i)
	svc, err := w.cs.CoreV1().Services(benchNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: portName, Port: svcPort,
			TargetPort: intstr.FromInt32(podPort), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Service %s: %w", name, err)
	}
	s := &service{Name: name, ClusterIP: svc.Spec.ClusterIP, Chain: svcChain(benchNS, name, portName),
		NFTChain: nftServiceChain(benchNS, name, portName)}
	var ips []string
	for j := range w.m {
		ips = append(ips, origEndpoint(i*w.m+j))
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(portName), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(podPort))}},
		Endpoints:   endpoints(ips),
	}
	if s.slice, err = w.cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating EndpointSlice of %s: %w", name, err)
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, hostPort(ip, podPort))
	}
	slices.Sort(s.Endpoints)
	w.svcs[i] = s
	return nil
}

func endpoints(ips []string) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, 0, len(ips))
	for _, ip := range ips {
		out = append(out, discoveryv1.Endpoint{Addresses: []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}})
	}
	return out
}

// setEndpoints replaces Service i's endpoint addresses (IPs) and returns when the API write returned.
func (w *workload) setEndpoints(ctx context.Context, i int, ips []string) (time.Time, error) {
	s := w.svcs[i]
	next := s.slice.DeepCopy()
	next.Endpoints = endpoints(ips)
	got, err := w.cs.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, next, metav1.UpdateOptions{})
	returned := time.Now()
	if err != nil {
		return returned, fmt.Errorf("updating EndpointSlice of %s: %w", s.Name, err)
	}
	s.slice = got
	return returned, nil
}

// sliceIPs returns the endpoint IPs Service i has in the API now.
func (w *workload) sliceIPs(i int) []string {
	var ips []string
	for _, e := range w.svcs[i].slice.Endpoints {
		ips = append(ips, e.Addresses...)
	}
	return ips
}

// restore puts back the original endpoints of the Services in touched.
func (w *workload) restore(ctx context.Context, touched map[int]bool) error {
	idx := make([]int, 0, len(touched))
	for i := range touched {
		idx = append(idx, i)
	}
	return parallel(ctx, 8, 0, len(idx), func(ctx context.Context, k int) error {
		i := idx[k]
		var ips []string
		for j := range w.m {
			ips = append(ips, origEndpoint(i*w.m+j))
		}
		_, err := w.setEndpoints(ctx, i, ips)
		return err
	})
}

func hostPort(ip string, port int) string {
	return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)).String()
}

func ptr[T any](v T) *T { return &v }
