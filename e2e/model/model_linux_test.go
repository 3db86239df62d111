package model

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kube-proxy/e2e/harness"
	"kube-proxy/proxy"
	"kube-proxy/proxy/apitest"
)

func TestMain(m *testing.M) { harness.Main(m) }

// env is one running test bed: a dual-stack cluster, the proxy under test with its recording dataplanes,
// and the test's record of what it wrote.
type env struct {
	t        *testing.T
	c        *harness.Cluster
	p        *proxy.Proxy
	reg      *prometheus.Registry
	dps      map[v1.IPFamily]*recorder
	w        *world
	nsA, nsB string
	timings  []timing
}

type timing struct {
	step            string
	writes          int
	writeTime       time.Duration
	convergence     time.Duration
	applies, fulls  int
	changedPortsSum int
}

const (
	workers        = 16
	convergeWithin = 45 * time.Second
)

// startCluster starts a dual-stack apiserver and etcd of the test's own (the shared cluster is
// single-stack).
func startCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	harness.RequireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := harness.StartClusterWith(ctx, t.TempDir(), harness.ClusterOptions{
		ServiceCIDRs: harness.ServiceCIDR + "," + harness.ServiceCIDRv6,
	})
	if err != nil {
		t.Fatalf("starting a dual-stack cluster: %v", err)
	}
	t.Logf("dual-stack cluster up in %v at %s", time.Since(start).Round(time.Millisecond), c.Server)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTail(40))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping cluster: %v", err)
		}
	})
	return c
}

// startProxy runs the proxy in this process as system:kube-proxy until the test ends.
func (e *env) startProxy() {
	t := e.t
	t.Helper()
	e.reg = prometheus.NewRegistry()
	e.dps = map[v1.IPFamily]*recorder{v1.IPv4Protocol: newRecorder(v1.IPv4Protocol), v1.IPv6Protocol: newRecorder(v1.IPv6Protocol)}
	e.p = proxy.New(proxy.Options{
		NodeName: nodeName,
		Dataplanes: []proxy.FamilyDataplane{
			{Family: v1.IPv4Protocol, Dataplane: e.dps[v1.IPv4Protocol]},
			{Family: v1.IPv6Protocol, Dataplane: e.dps[v1.IPv6Protocol]},
		},
		SyncPeriod:    10 * time.Second,
		MinSyncPeriod: 100 * time.Millisecond,
		ExternalIPs:   true,
		Registry:      e.reg,
	})
	cfg, err := e.c.RESTConfig(harness.UserKubeProxy)
	if err != nil {
		t.Fatalf("kube-proxy client config: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("kube-proxy client: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		select {
		case <-loopDone:
		case <-time.After(10 * time.Second):
			t.Errorf("the proxy's sync loop did not stop within 10s of its context ending")
		}
	})
	start := time.Now()
	// WatchAPI's context is also the informers' lifetime, so the wait for the initial sync is bounded by
	// a timer that ends the whole proxy instead.
	timer := time.AfterFunc(time.Minute, cancel)
	err = e.p.WatchAPI(ctx, apitest.New(client), 0)
	if !timer.Stop() || err != nil {
		close(loopDone)
		t.Fatalf("starting informers as system:kube-proxy: %v", err)
	}
	go func() {
		defer close(loopDone)
		e.p.Loop(ctx)
	}()
	select {
	case <-e.p.Ready():
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy was not ready 30s after its informers synced")
	}
	t.Logf("proxy informers synced and first sync done in %v", time.Since(start).Round(time.Millisecond))
}

// batch runs ops, then waits until both families' snapshots equal the expectation.
func (e *env) batch(step string, ops []op) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// What converged before must still hold: no late or flapping syncs.
	if d := e.mismatch(); d != "" {
		e.t.Fatalf("%s: before writing, the snapshots drifted from the last converged state:\n%s", step, summarize(d, 40))
	}
	a0, f0, c0 := e.counts()
	start := time.Now()
	if err := run(ctx, workers, ops); err != nil {
		e.t.Fatalf("%s: writing: %v", step, err)
	}
	e.converge(step, len(ops), time.Since(start), a0, f0, c0)
}

// converge polls until the latest snapshot of each family equals the expectation computed from the
// world, fails the test with the difference after convergeWithin, and records how long it took from now
// (the end of the writes) with the dataplanes' counts since a0, f0 and c0 (taken before the writes).
func (e *env) converge(step string, writes int, writeTime time.Duration, a0, f0, c0 int) {
	e.t.Helper()
	start := time.Now()
	deadline := start.Add(convergeWithin)
	for {
		diff := e.mismatch()
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: snapshots did not converge within %v:\n%s", step, convergeWithin, summarize(diff, 80))
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	a1, f1, c1 := e.counts()
	e.timings = append(e.timings, timing{step: step, writes: writes, writeTime: writeTime, convergence: took,
		applies: a1 - a0, fulls: f1 - f0, changedPortsSum: c1 - c0})
	e.t.Logf("%-40s %4d writes in %8v, converged %8v later (%d applies)", step, writes,
		writeTime.Round(time.Millisecond), took.Round(time.Millisecond), a1-a0)
	e.checkRecorders()
}

// mismatch returns the differences between expectation and snapshots, "" when there are none.
func (e *env) mismatch() string {
	o := e.w.objects()
	var b strings.Builder
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		snap := e.dps[family].Latest()
		if snap == nil {
			fmt.Fprintf(&b, "%s: no snapshot applied yet\n", family)
			continue
		}
		got, problems := viewOf(snap)
		for _, p := range problems {
			fmt.Fprintf(&b, "%s: %s\n", family, p)
		}
		if d := diffViews(expect(o, family), got); d != "" {
			fmt.Fprintf(&b, "%s (-want +got):\n%s", family, d)
		}
	}
	return b.String()
}

func (e *env) counts() (applies, fulls, changed int) {
	for _, r := range e.dps {
		a, f, c := r.Counts()
		applies, fulls, changed = applies+a, fulls+f, changed+c
	}
	return
}

func (e *env) checkRecorders() {
	e.t.Helper()
	for family, r := range e.dps {
		if errs := r.Errors(); len(errs) > 0 {
			e.t.Fatalf("%s dataplane saw inconsistent snapshots:\n%s", family, strings.Join(errs, "\n"))
		}
	}
}

// step runs fn as a subtest (e.t is the subtest meanwhile) and stops the test if it failed: later steps
// build on the state earlier ones left.
func (e *env) step(name string, fn func()) {
	parent := e.t
	if !parent.Run(name, func(t *testing.T) {
		e.t = t
		defer func() { e.t = parent }()
		fn()
	}) {
		parent.FailNow()
	}
}

// ns returns the namespace of Service i.
func (e *env) ns(i int) string {
	if i%2 == 0 {
		return e.nsA
	}
	return e.nsB
}

func (e *env) svcKey(i int) string { return key(e.ns(i), svcName(i)) }

// createOps returns the ops creating planned Services is and their slices.
func (e *env) createOps(is []int) []op {
	var ops []op
	for _, i := range is {
		ops = append(ops, func(ctx context.Context) error {
			if err := e.w.createService(ctx, planService(e.ns(i), i)); err != nil {
				return err
			}
			for _, es := range planSlices(e.w.service(e.svcKey(i)), i) {
				if err := e.w.putSlice(ctx, es); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return ops
}

// forSlices returns an op applying mutate to every slice of Service i.
func (e *env) forSlices(i int, mutate func(family v1.IPFamily, es *discovery.EndpointSlice)) op {
	return func(ctx context.Context) error {
		for _, k := range e.w.slicesOf(e.svcKey(i)) {
			if err := e.w.updateSlice(ctx, k, func(es *discovery.EndpointSlice) {
				family := v1.IPv4Protocol
				if es.AddressType == discovery.AddressTypeIPv6 {
					family = v1.IPv6Protocol
				}
				mutate(family, es)
			}); err != nil {
				return err
			}
		}
		return nil
	}
}

func (e *env) forService(i int, mutate func(*v1.Service)) op {
	return func(ctx context.Context) error { return e.w.updateService(ctx, e.svcKey(i), mutate) }
}

func span(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func setCond(ep *discovery.Endpoint, ready, serving, terminating bool) {
	ep.Conditions = discovery.EndpointConditions{Ready: ref(ready), Serving: ref(serving), Terminating: ref(terminating)}
}

// TestServiceModelConvergence drives the Service model through a real API server: 200 Services × 3
// endpoints, batches of mutations, apiserver restarts and a crash, malformed objects. After every step
// the snapshots both dataplanes received must equal the independently computed expectation.
func TestServiceModelConvergence(t *testing.T) {
	testStart := time.Now()
	c := startCluster(t)
	e := &env{t: t, c: c, w: newWorld(c.Admin, nodeName)}
	e.nsA, e.nsB = c.Namespace(t, "model-a"), c.Namespace(t, "model-b")
	ctx := context.Background()
	defer func() {
		if !t.Failed() {
			e.report(time.Since(testStart))
		}
	}()

	// The apiserver's own default/kubernetes Service is proxied like any other.
	e.adoptKubernetesService()
	// Objects that exist before the proxy starts reach it through the informers' initial list.
	if err := e.w.putNode(ctx, planNode(zoneA)); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, workers, e.createOps(span(0, 20))); err != nil {
		t.Fatal(err)
	}
	var extra []op
	for k := range 3 {
		extra = append(extra, e.headlessOp(k), e.externalNameOp(k))
	}
	if err := run(ctx, workers, extra); err != nil {
		t.Fatal(err)
	}
	e.startProxy()
	e.converge("initial list (20 Services)", 0, 0, 0, 0, 0)

	e.batch("create 180 Services in parallel", e.createOps(span(20, nServices)))

	e.step("ports", func() { e.portChanges() })
	e.step("endpoints", func() { e.endpointChanges() })
	e.step("policies", func() { e.policyChanges() })
	e.step("families and types", func() { e.familyAndTypeChanges() })
	e.step("slices relabelled", func() { e.sliceRelabels() })
	e.step("labels", func() { e.labelChanges() })
	e.step("conversions", func() { e.conversions() })
	e.step("split slices", func() { e.splitSlices() })
	e.step("deletions", func() { e.deletions() })
	e.step("node", func() { e.nodeChanges() })
	e.step("apiserver restart", func() { e.outage(false, span(140, 150), span(150, 155), span(200, 205)) })
	e.step("apiserver killed", func() { e.outage(true, span(160, 170), span(170, 175), span(205, 210)) })
	e.step("malformed objects", func() { e.malformed() })

	// Every slice write carried a trigger time, so network programming latency was observed per family.
	for _, family := range []string{"IPv4", "IPv6"} {
		if n := histogramCount(t, e.reg, "kubeproxy_network_programming_duration_seconds", "ip_family", family); n == 0 {
			t.Errorf("kubeproxy_network_programming_duration_seconds{ip_family=%q} has no samples", family)
		}
	}
	if !e.p.Health().Status().Healthy {
		t.Errorf("the proxy does not report itself healthy at the end")
	}
}

// adoptKubernetesService waits for the apiserver to create default/kubernetes and records it.
func (e *env) adoptKubernetesService() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		svc, err := e.c.Admin.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil {
			e.w.storeService(svc)
			return
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("the apiserver did not create default/kubernetes: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// headlessOp creates headless Service k with a slice (labelled as the EndpointSlice controller labels
// the slices of headless Services): never proxied.
func (e *env) headlessOp(k int) op {
	return func(ctx context.Context) error {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: e.nsA, Name: fmt.Sprintf("headless-%d", k)},
			Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
		if err := e.w.createService(ctx, svc); err != nil {
			return err
		}
		svc = e.w.service(key(svc.Namespace, svc.Name))
		es := newSlice(svc, svc.Name+"-v4", v1.IPv4Protocol)
		es.Labels[v1.IsHeadlessService] = ""
		es.Ports = slicePorts(svc)
		es.Endpoints = []discovery.Endpoint{endpointOn(svc, v1.IPv4Protocol, 240+k, 0, nodeName)}
		return e.w.putSlice(ctx, es)
	}
}

// externalNameOp creates ExternalName Service k: never proxied.
func (e *env) externalNameOp(k int) op {
	return func(ctx context.Context) error {
		return e.w.createService(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: e.nsB, Name: fmt.Sprintf("ext-%d", k)},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeExternalName, ExternalName: "example.com",
				Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}})
	}
}

// portChanges changes Service port numbers, slice port numbers, renames, adds and removes ports and
// changes a port's protocol.
func (e *env) portChanges() {
	var ops []op
	for _, i := range []int{0, 20, 40} { // Service port number
		ops = append(ops, e.forService(i, func(s *v1.Service) { s.Spec.Ports[0].Port += 1000 }))
	}
	for _, i := range []int{60, 80} { // endpoint port number
		ops = append(ops, e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) {
			for j := range es.Ports {
				es.Ports[j].Port = ref(*es.Ports[j].Port + 1)
			}
		}))
	}
	// Renaming a Service port leaves it without endpoints until its slices are renamed too (33).
	ops = append(ops, e.forService(3, func(s *v1.Service) { s.Spec.Ports[0].Name = "web" }))
	ops = append(ops, func(ctx context.Context) error {
		if err := e.forService(33, func(s *v1.Service) { s.Spec.Ports[0].Name = "web" })(ctx); err != nil {
			return err
		}
		return e.forSlices(33, func(_ v1.IPFamily, es *discovery.EndpointSlice) { es.Ports[0].Name = ref("web") })(ctx)
	})
	for _, i := range []int{102, 123} { // add a port, Service and slices
		ops = append(ops, func(ctx context.Context) error {
			if err := e.forService(i, func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "extra", Port: 7000, Protocol: v1.ProtocolTCP})
			})(ctx); err != nil {
				return err
			}
			return e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) {
				es.Ports = append(es.Ports, discovery.EndpointPort{Name: ref("extra"), Protocol: ref(v1.ProtocolTCP), Port: ref(int32(17000))})
			})(ctx)
		})
	}
	for _, i := range []int{6, 36} { // remove the dns port from the Service only
		ops = append(ops, e.forService(i, func(s *v1.Service) { s.Spec.Ports = s.Spec.Ports[:1] }))
	}
	ops = append(ops, e.forService(9, func(s *v1.Service) { s.Spec.Ports[1].Protocol = v1.ProtocolTCP })) // dns/UDP → TCP
	e.batch("ports: numbers, names, add/remove, protocol", ops)
}

// endpointChanges adds, removes, un-readies and terminates endpoints, including local ones of
// externalTrafficPolicy Local Services, and moves a zone hint.
func (e *env) endpointChanges() {
	var ops []op
	for _, i := range []int{1, 21, 41} { // add a fourth endpoint
		ops = append(ops, e.forSlices(i, func(f v1.IPFamily, es *discovery.EndpointSlice) {
			es.Endpoints = append(es.Endpoints, endpointOn(e.w.service(e.svcKey(i)), f, i, 3, "node-b"))
		}))
	}
	for _, i := range []int{61, 81} { // remove the second
		ops = append(ops, e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) {
			es.Endpoints = slices.Delete(es.Endpoints, 1, 2)
		}))
	}
	for _, i := range []int{101, 121} { // the local one is not ready
		ops = append(ops, e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) { setCond(&es.Endpoints[0], false, false, false) }))
	}
	for _, i := range []int{141, 161} { // all terminating, still serving: fall back to them
		ops = append(ops, e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) {
			for j := range es.Endpoints {
				setCond(&es.Endpoints[j], false, true, true)
			}
		}))
	}
	for _, i := range []int{13, 14} { // ETP Local: the local endpoint terminating (serving) → local fallback
		ops = append(ops, e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) { setCond(&es.Endpoints[0], false, true, true) }))
	}
	ops = append(ops, e.forSlices(25, func(_ v1.IPFamily, es *discovery.EndpointSlice) { // ETP Local, local one gone
		setCond(&es.Endpoints[0], false, false, true)
	}))
	ops = append(ops, e.forSlices(4, func(_ v1.IPFamily, es *discovery.EndpointSlice) { // zone hint moves away
		es.Endpoints[0].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zoneB}}}
	}))
	ops = append(ops, e.forSlices(8, func(_ v1.IPFamily, es *discovery.EndpointSlice) { // node-hinted, local one not ready
		setCond(&es.Endpoints[0], false, false, false)
	}))
	e.batch("endpoints: add/remove/not-ready/terminating", ops)
}

// policyChanges flips traffic policies, affinity, traffic distribution, load-balancer status and source
// ranges, and moves this node to another zone (which re-selects every Service's endpoints).
func (e *env) policyChanges() {
	local, cluster := v1.ServiceInternalTrafficPolicyLocal, v1.ServiceInternalTrafficPolicyCluster
	ops := []op{
		e.forService(7, func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }),
		e.forService(2, func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster }),
		e.forService(3, func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &cluster }),
		e.forService(5, func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.SessionAffinity, s.Spec.SessionAffinityConfig = v1.ServiceAffinityNone, nil
		}),
		e.forService(16, func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ref(int32(60))}}
		}),
		e.forService(27, func(s *v1.Service) { s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = ref(int32(999)) }),
		e.forService(10, func(s *v1.Service) { s.Spec.TrafficDistribution = ref(v1.ServiceTrafficDistributionPreferClose) }),
		e.forService(8, func(s *v1.Service) {
			s.Status.LoadBalancer.Ingress[0].IP = "192.0.2.208"
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/25"}
		}),
		// ETP Local without node ports or ingress IPs is not externally accessible yet: no Local endpoints
		// until an ingress IP arrives.
		e.forService(14, func(s *v1.Service) { s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.214"}} }),
		e.forService(20, func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "fd00::/8"} }),
		func(ctx context.Context) error { return e.w.putNode(ctx, planNode(zoneB)) },
	}
	e.batch("policies, affinity, LB status, node zone", ops)
}

// familyAndTypeChanges upgrades a Service to dual-stack (and gives it IPv6 endpoints), downgrades a
// dual-stack one to its primary family, and turns a ClusterIP Service into a NodePort one and back.
func (e *env) familyAndTypeChanges() {
	ops := []op{
		func(ctx context.Context) error {
			if err := e.forService(11, func(s *v1.Service) { s.Spec.IPFamilyPolicy = ref(v1.IPFamilyPolicyRequireDualStack) })(ctx); err != nil {
				return err
			}
			for _, es := range planSlices(e.w.service(e.svcKey(11)), 11) {
				if err := e.w.putSlice(ctx, es); err != nil {
					return err
				}
			}
			return nil
		},
		e.forService(12, func(s *v1.Service) {
			s.Spec.IPFamilyPolicy = ref(v1.IPFamilyPolicySingleStack)
			s.Spec.ClusterIPs, s.Spec.IPFamilies = s.Spec.ClusterIPs[:1], s.Spec.IPFamilies[:1]
		}),
		e.forService(18, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }),
		e.forService(19, func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeClusterIP, ""
			for j := range s.Spec.Ports {
				s.Spec.Ports[j].NodePort = 0
			}
		}),
	}
	e.batch("families: up/downgrade; types: NodePort and back", ops)
}

// sliceRelabels moves a slice from one Service to another by its service-name label, and takes the label
// off another slice: the endpoints must follow (or leave).
func (e *env) sliceRelabels() {
	ops := []op{
		func(ctx context.Context) error {
			return e.w.updateSlice(ctx, key(e.nsA, "svc-042-v4"), func(es *discovery.EndpointSlice) {
				es.Labels[discovery.LabelServiceName] = svcName(48)
			})
		},
		func(ctx context.Context) error {
			return e.w.updateSlice(ctx, key(e.nsA, "svc-050-v4"), func(es *discovery.EndpointSlice) {
				delete(es.Labels, discovery.LabelServiceName)
			})
		},
	}
	e.batch("slice moved to another Service, label removed", ops)
}

// labelChanges hands Services to another proxy (they disappear; an empty label value counts too) and
// back, and adds unrelated labels.
func (e *env) labelChanges() {
	var ops []op
	for _, i := range span(30, 40) {
		value := "other-proxy"
		if i >= 35 {
			value = "" // present but empty: still another proxy's
		}
		ops = append(ops, e.forService(i, func(s *v1.Service) { s.Labels[labelServiceProxyName] = value }))
	}
	for _, i := range span(40, 45) {
		ops = append(ops, e.forService(i, func(s *v1.Service) { s.Labels["unrelated"] = "yes" }))
	}
	e.batch("labels: service-proxy-name added", ops)

	ops = nil
	for _, i := range span(30, 35) {
		ops = append(ops, e.forService(i, func(s *v1.Service) { delete(s.Labels, labelServiceProxyName) }))
	}
	ops = append(ops, e.forService(35, func(s *v1.Service) { s.Labels[labelServiceProxyName] = "yet-another" }))
	e.batch("labels: service-proxy-name removed", ops)
}

// conversions turns ClusterIP Services into ExternalName ones, some of those into headless ones and one
// back into a ClusterIP Service; and an ExternalName Service into a ClusterIP one.
func (e *env) conversions() {
	toExternalName := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeExternalName
		s.Spec.ExternalName = "svc.example.com"
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = nil, nil
		s.Spec.InternalTrafficPolicy, s.Spec.ExternalTrafficPolicy = nil, ""
		s.Spec.ExternalIPs = nil
		s.Spec.SessionAffinity, s.Spec.SessionAffinityConfig = v1.ServiceAffinityNone, nil
		s.Spec.TrafficDistribution = nil
	}
	var ops []op
	for _, i := range []int{54, 57, 58, 59, 60} {
		ops = append(ops, e.forService(i, toExternalName))
	}
	ops = append(ops, func(ctx context.Context) error {
		k := key(e.nsB, "ext-0")
		if err := e.w.updateService(ctx, k, func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeClusterIP, ""
		}); err != nil {
			return err
		}
		svc := e.w.service(k)
		es := newSlice(svc, "ext-0-v4", v1.IPv4Protocol)
		es.Ports = slicePorts(svc)
		es.Endpoints = []discovery.Endpoint{endpointOn(svc, v1.IPv4Protocol, 245, 0, "node-b")}
		return e.w.putSlice(ctx, es)
	})
	e.batch("conversions: to ExternalName", ops)

	ops = nil
	for _, i := range []int{54, 57} {
		ops = append(ops, func(ctx context.Context) error {
			if err := e.forService(i, func(s *v1.Service) {
				s.Spec.Type, s.Spec.ExternalName, s.Spec.ClusterIP = v1.ServiceTypeClusterIP, "", v1.ClusterIPNone
			})(ctx); err != nil {
				return err
			}
			return e.forSlices(i, func(_ v1.IPFamily, es *discovery.EndpointSlice) { es.Labels[v1.IsHeadlessService] = "" })(ctx)
		})
	}
	ops = append(ops, e.forService(58, func(s *v1.Service) { s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeClusterIP, "" }))
	e.batch("conversions: to headless, back to ClusterIP", ops)
}

// splitSlices replaces the slices of some Services by three each, with an identical duplicate, a
// duplicate that is terminating (the ready copy must win) and a new endpoint; and moves an endpoint to a
// new slice the way the EndpointSlice controller does (added there before removed here).
func (e *env) splitSlices() {
	var ops []op
	for _, i := range span(70, 80) {
		ops = append(ops, func(ctx context.Context) error {
			svc := e.w.service(e.svcKey(i))
			for _, family := range svc.Spec.IPFamilies {
				ep := func(j int, node string) discovery.Endpoint { return endpointOn(svc, family, i, j, node) }
				name := sliceName(svc.Name, family)
				a, b, c := newSlice(svc, name+"-a", family), newSlice(svc, name+"-b", family), newSlice(svc, name+"-c", family)
				for _, es := range []*discovery.EndpointSlice{a, b, c} {
					es.Ports = slicePorts(svc)
				}
				dup := ep(0, "node-a")
				setCond(&dup, false, true, true)
				a.Endpoints = []discovery.Endpoint{dup, ep(3, "node-c")}
				b.Endpoints = []discovery.Endpoint{ep(0, "node-a"), ep(1, "node-b")}
				c.Endpoints = []discovery.Endpoint{ep(1, "node-b"), ep(2, "node-c")}
				for _, es := range []*discovery.EndpointSlice{a, b, c} {
					if err := e.w.putSlice(ctx, es); err != nil {
						return err
					}
				}
				if err := e.w.deleteSlice(ctx, key(svc.Namespace, name)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for _, i := range []int{82, 83} {
		ops = append(ops, func(ctx context.Context) error {
			svc := e.w.service(e.svcKey(i))
			for _, family := range svc.Spec.IPFamilies {
				name := sliceName(svc.Name, family)
				moved := newSlice(svc, name+"-moved", family)
				moved.Ports = slicePorts(svc)
				old := e.w.slice(key(svc.Namespace, name))
				moved.Endpoints = []discovery.Endpoint{old.Endpoints[2]}
				if err := e.w.putSlice(ctx, moved); err != nil {
					return err
				}
				if err := e.w.updateSlice(ctx, key(svc.Namespace, name), func(es *discovery.EndpointSlice) {
					es.Endpoints = es.Endpoints[:2]
				}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	e.batch("split slices with duplicates, move", ops)
}

// deletions deletes Services with their slices, only the slices of others (no endpoints left) and only
// the Service of others (slices for an unknown Service), then recreates the latter.
func (e *env) deletions() {
	var ops []op
	for _, i := range span(90, 110) {
		ops = append(ops, func(ctx context.Context) error {
			for _, k := range e.w.slicesOf(e.svcKey(i)) {
				if err := e.w.deleteSlice(ctx, k); err != nil {
					return err
				}
			}
			return e.w.deleteService(ctx, e.svcKey(i))
		})
	}
	for _, i := range span(110, 120) {
		ops = append(ops, func(ctx context.Context) error {
			for _, k := range e.w.slicesOf(e.svcKey(i)) {
				if err := e.w.deleteSlice(ctx, k); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for _, i := range span(120, 125) {
		ops = append(ops, func(ctx context.Context) error { return e.w.deleteService(ctx, e.svcKey(i)) })
	}
	e.batch("deletions", ops)

	ops = nil
	for _, i := range span(120, 125) {
		ops = append(ops, func(ctx context.Context) error { return e.w.createService(ctx, planService(e.ns(i), i)) })
	}
	e.batch("recreate Services whose slices stayed", ops)
}

// nodeChanges deletes this node's Node object (zone hints no longer apply) and recreates it in zone-a.
func (e *env) nodeChanges() {
	e.batch("node deleted", []op{func(ctx context.Context) error { return e.w.deleteNode(ctx) }})
	e.batch("node recreated in zone-a", []op{func(ctx context.Context) error { return e.w.putNode(ctx, planNode(zoneA)) }})
}

// outage stops (or kills) the apiserver, checks the snapshots stay as they were while it is away, starts
// it again and right away changes endpoints of changeEps, deletes deleteSvcs and creates createSvcs; the
// same proxy must catch up.
func (e *env) outage(kill bool, changeEps, deleteSvcs, createSvcs []int) {
	t := e.t
	what := "stopped"
	stop := e.c.StopAPIServer
	if kill {
		what, stop = "killed", e.c.KillAPIServer
	}
	a0, _, _ := e.counts()
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("apiserver %s: %v", what, err)
	}
	t.Logf("apiserver %s in %v", what, time.Since(t0).Round(time.Millisecond))
	// While it is away nothing may change. (The informers back off exponentially, from 0.8 s with
	// jitter, while they cannot reach it: the longer the outage, the longer they take to come back.)
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if d := e.mismatch(); d != "" {
			t.Fatalf("snapshots changed while the apiserver was %s:\n%s", what, summarize(d, 40))
		}
	}
	if a1, _, _ := e.counts(); a1 != a0 {
		t.Logf("%d syncs ran during the outage (periodic full syncs; content unchanged)", a1-a0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t1 := time.Now()
	if err := e.c.StartAPIServer(ctx); err != nil {
		t.Fatalf("starting the apiserver again: %v", err)
	}
	t.Logf("apiserver ready again in %v", time.Since(t1).Round(time.Millisecond))
	afterStart := time.Now()

	var ops []op
	for _, i := range changeEps {
		ops = append(ops, e.forSlices(i, func(f v1.IPFamily, es *discovery.EndpointSlice) {
			if kill {
				es.Endpoints = es.Endpoints[:len(es.Endpoints)-1]
			} else {
				es.Endpoints = append(es.Endpoints, endpointOn(e.w.service(e.svcKey(i)), f, i, 5, "node-a"))
			}
		}))
	}
	for _, i := range deleteSvcs {
		ops = append(ops, func(ctx context.Context) error {
			for _, k := range e.w.slicesOf(e.svcKey(i)) {
				if err := e.w.deleteSlice(ctx, k); err != nil {
					return err
				}
			}
			return e.w.deleteService(ctx, e.svcKey(i))
		})
	}
	ops = append(ops, e.createOps(createSvcs)...)
	e.batch(fmt.Sprintf("after apiserver %s: %d changes", what, len(ops)), ops)
	t.Logf("converged %v after the apiserver was ready again, without restarting the proxy",
		time.Since(afterStart).Round(time.Millisecond))
}

// malformed writes objects the apiserver accepts but kube-proxy cannot use, checks each is skipped and
// counted in kubeproxy_skipped_api_objects_total, and that the usable parts of them are used.
func (e *env) malformed() {
	t := e.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := counterValue(t, e.reg, "kubeproxy_skipped_api_objects_total", "kind", "EndpointSlice")

	// First, what the apiserver refuses (so the proxy never sees it): an address of the other family, an
	// IPv4-mapped IPv6 address, leading zeros. If it ever accepts one, this test must learn to expect it.
	host := e.w.service(e.svcKey(130))
	for _, bad := range []struct {
		typ  discovery.AddressType
		addr string
	}{{discovery.AddressTypeIPv4, "fd00:10:244::99"}, {discovery.AddressTypeIPv6, "::ffff:10.244.0.99"}, {discovery.AddressTypeIPv4, "010.244.0.99"}} {
		es := newSlice(host, "refused", v1.IPv4Protocol)
		es.AddressType = bad.typ
		es.Ports = slicePorts(host)
		es.Endpoints = []discovery.Endpoint{{Addresses: []string{bad.addr}}}
		if _, err := e.c.Admin.DiscoveryV1().EndpointSlices(host.Namespace).Create(ctx, es, metav1.CreateOptions{}); err == nil {
			t.Errorf("the apiserver accepted a %s slice with address %q; cover it here", bad.typ, bad.addr)
		} else {
			t.Logf("refused by the apiserver, as expected: %s slice with %q", bad.typ, bad.addr)
		}
	}

	good := func(svc *v1.Service, name string, j int) *discovery.EndpointSlice {
		es := newSlice(svc, name, v1.IPv4Protocol)
		es.Ports = slicePorts(svc)
		es.Endpoints = []discovery.Endpoint{endpointOn(svc, v1.IPv4Protocol, 130, j, "node-b")}
		return es
	}
	var ops []op
	wantSkips := 0
	// No service-name label, or an empty one: the slice belongs to no Service.
	noLabel := good(host, "no-label", 20)
	delete(noLabel.Labels, discovery.LabelServiceName)
	emptyLabel := good(host, "empty-label", 21)
	emptyLabel.Labels[discovery.LabelServiceName] = ""
	// A port without a number, and one numbered 0: the port is unusable, its endpoints unused.
	nilPort := good(host, "nil-port", 22)
	nilPort.Ports[0].Port = nil
	zeroPort := good(host, "zero-port", 23)
	zeroPort.Ports[0].Port = ref(int32(0))
	// An unparsable trigger time: the annotation is ignored, the endpoints are used.
	badTime := good(host, "bad-trigger-time", 24)
	badTime.Annotations[v1.EndpointsLastChangeTriggerTime] = "yesterday"
	wantSkips += 5
	// Not counted: an FQDN slice (not supported, silently ignored as upstream does), a slice whose port
	// name matches no Service port, an endpoint with two addresses (the first is used).
	fqdn := good(host, "fqdn", 25)
	fqdn.AddressType = discovery.AddressTypeFQDN
	fqdn.Endpoints[0].Addresses = []string{"backend.example.com"}
	otherPort := good(host, "other-port", 26)
	otherPort.Ports[0].Name = ref("nope")
	twoAddrs := good(host, "two-addresses", 27)
	twoAddrs.Endpoints[0].Addresses = append(twoAddrs.Endpoints[0].Addresses, "10.244.130.99")
	for _, es := range []*discovery.EndpointSlice{noLabel, emptyLabel, nilPort, zeroPort, badTime, fqdn, otherPort, twoAddrs} {
		ops = append(ops, func(ctx context.Context) error { return e.w.putSlice(ctx, es) })
	}
	// A slice for a Service that does not exist (yet): kept aside, used once the Service appears.
	ghost := planService(e.nsA, 230)
	ghost.Name = "ghost"
	ghostSlice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: e.nsA, Name: "ghost-v4", Labels: map[string]string{discovery.LabelServiceName: "ghost"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       slicePorts(ghost),
		Endpoints:   []discovery.Endpoint{endpointOn(ghost, v1.IPv4Protocol, 230, 0, "node-c")},
	}
	ops = append(ops, func(ctx context.Context) error { return e.w.putSlice(ctx, ghostSlice) })
	// The orphan slice is set aside (noted at -v=2) but not counted: a slice arriving before its Service is
	// normal, not an unusable object.
	e.batch("malformed slices, slice without Service", ops)

	if got := counterValue(t, e.reg, "kubeproxy_skipped_api_objects_total", "kind", "EndpointSlice") - before; got != float64(wantSkips) {
		t.Errorf("kubeproxy_skipped_api_objects_total{kind=EndpointSlice} rose by %v, want %d", got, wantSkips)
	}
	e.batch("the Service of the orphan slice appears", []op{func(ctx context.Context) error { return e.w.createService(ctx, ghost) }})
}

// counterValue reads one counter of reg by name and a label.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	m := findMetric(t, reg, name, label, value)
	if m == nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}

// histogramCount reads the sample count of one histogram of reg by name and a label.
func histogramCount(t *testing.T, reg *prometheus.Registry, name, label, value string) uint64 {
	t.Helper()
	m := findMetric(t, reg, name, label, value)
	if m == nil || m.Histogram == nil {
		return 0
	}
	return m.Histogram.GetSampleCount()
}

func findMetric(t *testing.T, reg *prometheus.Registry, name, label, value string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == label && l.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}

// report logs the timings table and the dataplanes' counts.
func (e *env) report(total time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "%-48s %6s %10s %12s %8s %6s %8s\n", "step", "writes", "write", "convergence", "applies", "full", "changes")
	for _, tm := range e.timings {
		fmt.Fprintf(&b, "%-48s %6d %10v %12v %8d %6d %8d\n", tm.step, tm.writes, tm.writeTime.Round(time.Millisecond),
			tm.convergence.Round(time.Millisecond), tm.applies, tm.fulls, tm.changedPortsSum)
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		a, f, c := e.dps[family].Counts()
		fmt.Fprintf(&b, "%s dataplane: %d applies (%d full), %d port changes, %d ports now\n", family, a, f, c,
			len(e.dps[family].Latest().Services))
	}
	fmt.Fprintf(&b, "total %v", total.Round(time.Millisecond))
	e.t.Logf("convergence report:\n%s", b.String())
}
