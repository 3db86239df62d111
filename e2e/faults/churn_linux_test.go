package faults

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/e2e/harness"
)

// churnWorkers write to the API in parallel; each owns every churnWorkers-th Service.
const churnWorkers = 16

// churn is a set of Services with one EndpointSlice each, whose slices the test rewrites.
type churn struct {
	b      *bed
	slices []*discoveryv1.EndpointSlice // the last version written of each, for its resourceVersion
}

// newChurn creates n Services "c-<i>" with two (unreachable) endpoints each.
func newChurn(t *testing.T, b *bed, n int) *churn {
	t.Helper()
	c := &churn{b: b, slices: make([]*discoveryv1.EndpointSlice, n)}
	start := time.Now()
	c.parallel(t, n, func(ctx context.Context, i int) error {
		name := "c-" + strconv.Itoa(i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Ports: harness.WebPorts()}}
		if _, err := b.Cluster.Admin.CoreV1().Services(b.NS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return err
		}
		s, err := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS).Create(ctx, churnSlice(name, i, 0), metav1.CreateOptions{})
		c.slices[i] = s
		return err
	})
	t.Logf("created %d Services with their slices in %v", n, time.Since(start).Round(time.Millisecond))
	return c
}

// churnSlice is Service i's slice at change number gen: its second endpoint moves with every change.
func churnSlice(svc string, i, gen int) *discoveryv1.EndpointSlice {
	ep := func(addr string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr(harness.OtherNode),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}}
	}
	port, proto := int32(harness.PodTCPPort), corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-0", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("tcp"), Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{
			ep(fmt.Sprintf("10.246.%d.%d", i/250%250, i%250+1)),
			ep(fmt.Sprintf("10.247.%d.%d", gen/250%250, gen%250+1)),
		},
	}
}

func ptr[T any](v T) *T { return &v }

// parallel runs f for 0..n-1 on churnWorkers goroutines, worker w taking every index i with
// i % churnWorkers == w, and fails t on the first error.
func (c *churn) parallel(t *testing.T, n int, f func(ctx context.Context, i int) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for w := range churnWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += churnWorkers {
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

// sample is the daemon's memory and goroutines after some changes.
type sample struct {
	at         time.Time
	changes    int
	rss        int64
	goroutines int
}

// run makes changes slice rewrites, round robin over the Services, sampling the daemon 20 times.
func (c *churn) run(t *testing.T, d *harness.Daemon, changes int) []sample {
	t.Helper()
	var done atomic.Int64
	var mu sync.Mutex
	samples := []sample{c.sample(t, d, 0)}
	every := max(changes/20, 1)
	n := len(c.slices)
	c.parallel(t, changes, func(ctx context.Context, k int) error {
		i := k % n // two workers may write the same slice: its last version is kept under mu
		s := churnSlice("c-"+strconv.Itoa(i), i, k+1)
		mu.Lock()
		s.ResourceVersion = c.slices[i].ResourceVersion
		mu.Unlock()
		out, err := c.b.Cluster.Admin.DiscoveryV1().EndpointSlices(c.b.NS).Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			// Another worker wrote this slice meanwhile: take its version and go on.
			cur, gerr := c.b.Cluster.Admin.DiscoveryV1().EndpointSlices(c.b.NS).Get(ctx, s.Name, metav1.GetOptions{})
			if gerr != nil {
				return fmt.Errorf("change %d: %w (and %w)", k, err, gerr)
			}
			out = cur
		}
		mu.Lock()
		c.slices[i] = out
		mu.Unlock()
		if m := done.Add(1); m%int64(every) == 0 {
			smp := c.sample(t, d, int(m))
			mu.Lock()
			samples = append(samples, smp)
			mu.Unlock()
		}
		return nil
	})
	t.Logf("%d changes in %v", changes, time.Since(samples[0].at).Round(time.Millisecond))
	slices.SortFunc(samples, func(a, b sample) int { return a.changes - b.changes })
	return samples
}

func (c *churn) sample(t *testing.T, d *harness.Daemon, changes int) sample {
	s := sample{at: time.Now(), changes: changes}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Proc.PID())); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				s.rss = kb << 10
			}
		}
	}
	if v, ok := d.Metric(t, "go_goroutines"); ok {
		s.goroutines = int(v)
	}
	return s
}
