package proxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"kube-proxy/config"
)

// fakeDataplane keeps the Service ports it was given the way a real dataplane keeps kernel state: a full
// Apply replaces everything, a partial one touches only snap.Changes(last applied). It can be told to fail.
type fakeDataplane struct {
	mu       sync.Mutex
	fail     error
	calls    []applyCall
	last     *Snapshot
	state    map[ServicePortName]*ServicePort
	problems []string
}

type applyCall struct {
	gen  uint64
	full bool
	err  error
}

func newFakeDataplane() *fakeDataplane {
	return &fakeDataplane{state: map[ServicePortName]*ServicePort{}}
}

// Reconfigure takes any configuration (reconfigDataplane records and refuses them).
func (f *fakeDataplane) Reconfigure(*config.KubeProxyConfiguration) error { return nil }

// Watch has nothing to watch.
func (f *fakeDataplane) Watch(context.Context, time.Duration, func(full bool)) {}

// Stop has nothing to finish (stoppingDataplane has).
func (f *fakeDataplane) Stop(context.Context) {}

func (f *fakeDataplane) Apply(_ context.Context, snap *Snapshot, full bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, applyCall{gen: snap.Generation, full: full, err: f.fail})
	if f.fail != nil {
		f.last = nil // our own failure: the next call is treated as full
		return f.fail
	}
	if full || f.last == nil {
		f.state = maps.Clone(snap.Services)
	} else {
		changed := snap.Changes(f.last)
		if diff := cmp.Diff(slowChanges(f.last, snap), changed); diff != "" {
			f.problems = append(f.problems, fmt.Sprintf("gen %d: Changes differs from a full comparison: %s", snap.Generation, diff))
		}
		for _, name := range changed {
			if p, ok := snap.Services[name]; ok {
				f.state[name] = p
			} else {
				delete(f.state, name)
			}
		}
	}
	// Incremental state must equal the snapshot exactly (same pointers).
	if len(f.state) != len(snap.Services) {
		f.problems = append(f.problems, fmt.Sprintf("gen %d (full=%v): %d ports kept, snapshot has %d", snap.Generation, full, len(f.state), len(snap.Services)))
	}
	for name, p := range snap.Services {
		if f.state[name] != p {
			f.problems = append(f.problems, fmt.Sprintf("gen %d (full=%v): stale state for %s", snap.Generation, full, name))
		}
	}
	f.last = snap
	return nil
}

func (f *fakeDataplane) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *fakeDataplane) snapshotCalls() []applyCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeDataplane) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.problems {
		t.Error(p)
	}
}

type testProxy struct {
	*Proxy
	reg *prometheus.Registry
	v4  *fakeDataplane
	v6  *fakeDataplane
}

// newTestProxy returns a dual-stack (IPv4 primary) Proxy with fake dataplanes; the loop is not started.
func newTestProxy(t *testing.T, syncPeriod time.Duration, onApplied func(*Snapshot)) *testProxy {
	reg := prometheus.NewRegistry()
	v4, v6 := newFakeDataplane(), newFakeDataplane()
	p := New(Options{
		NodeName:      thisNode,
		Dataplanes:    []FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: v4}, {Family: v1.IPv6Protocol, Dataplane: v6}},
		SyncPeriod:    syncPeriod,
		MinSyncPeriod: 0,
		ExternalIPs:   true,
		Registry:      reg,
		OnApplied:     onApplied,
	})
	return &testProxy{Proxy: p, reg: reg, v4: v4, v6: v6}
}

func (p *testProxy) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (p *testProxy) syncNow(t *testing.T, full bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.SyncNow(ctx, full)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("SyncNow never returned")
	}
	return err
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// gather returns the registry's metric families by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// metricWith returns the metric of family name whose labels include want.
func metricWith(mfs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if have[k] != v {
				match = false
			}
		}
		if match {
			return m
		}
	}
	return nil
}

func TestProxyReadyOnlyAfterEveryFamilySynced(t *testing.T) {
	p := newTestProxy(t, time.Hour, nil)
	p.v6.setFail(errors.New("ip6tables-restore failed"))
	p.start(t)
	eventually(t, "the first sync to fail", func() bool { return func() bool { n, _, _ := p.runner.FailureState(); return n == 1 }() })
	if isClosed(p.Ready()) {
		t.Fatal("Ready closed although the IPv6 dataplane failed")
	}
	if p.LastApplied(v1.IPv4Protocol) == nil || p.LastApplied(v1.IPv6Protocol) != nil {
		t.Errorf("LastApplied: IPv4 %v, IPv6 %v; want only IPv4", p.LastApplied(v1.IPv4Protocol), p.LastApplied(v1.IPv6Protocol))
	}
	p.v6.setFail(nil)
	select {
	case <-p.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("Ready never closed after the IPv6 dataplane recovered")
	}
	calls := p.v6.snapshotCalls()
	if len(calls) < 2 || !calls[1].full {
		t.Errorf("IPv6 applies %+v: want a full retry after the failure", calls)
	}
	p.v4.check(t)
	p.v6.check(t)
}

func TestProxyFailingFamilyRetriesFull(t *testing.T) {
	var appliedMu sync.Mutex
	var applied []string
	p := newTestProxy(t, time.Hour, func(s *Snapshot) {
		appliedMu.Lock()
		applied = append(applied, fmt.Sprintf("%s/%d", s.Family, s.Generation))
		appliedMu.Unlock()
	})
	tr := p.Tracker()
	tr.start = time.Now().Add(-time.Hour)
	p.start(t)
	if err := p.syncNow(t, false); err != nil {
		t.Fatal(err)
	}

	// A partial sync in which IPv6 fails: its trigger time must be observed only once it is applied.
	p.v6.setFail(errors.New("ip6tables-restore failed"))
	tr.OnService(nil, webService(dualStack("10.0.0.10", "fd00::10")))
	es := makeSlice("ns", "web", "web-v6", ipv6, []slicePortSpec{sp("http", 8080, tcp)}, epSpec{ip: "fd00:1::1"})
	es.Annotations = map[string]string{AnnotationLastChangeTriggerTime: time.Now().Add(-time.Minute).Format(time.RFC3339Nano)}
	tr.OnEndpointSlice(nil, es)
	if err := p.syncNow(t, false); err == nil {
		t.Fatal("want the IPv6 failure reported")
	}
	if got := programmingCount(t, p.reg, "IPv6"); got != 0 {
		t.Errorf("network programming observed %d times for a failed apply", got)
	}
	p.v6.setFail(nil)
	if err := p.syncNow(t, false); err != nil {
		t.Fatal(err)
	}
	// The first failure happened in a partial sync; every sync from then on (retries, until one
	// succeeds) is full, for both families.
	v6calls := p.v6.snapshotCalls()
	firstFail := slices.IndexFunc(v6calls, func(c applyCall) bool { return c.err != nil })
	if firstFail < 0 || v6calls[firstFail].full {
		t.Fatalf("IPv6 applies %+v: want a failed partial sync", v6calls)
	}
	for name, dp := range map[string]*fakeDataplane{"IPv4": p.v4, "IPv6": p.v6} {
		calls := dp.snapshotCalls()
		if len(calls) < firstFail+2 || calls[len(calls)-1].err != nil {
			t.Errorf("%s applies %+v: want a successful retry after the failure", name, calls)
			continue
		}
		for _, c := range calls[firstFail+1:] {
			if !c.full {
				t.Errorf("%s applies %+v: a sync after the failure was partial", name, calls)
			}
		}
		dp.check(t)
	}
	if got := programmingCount(t, p.reg, "IPv6"); got != 1 {
		t.Errorf("network programming observed %d times after the retry, want 1", got)
	}
	last := p.LastApplied(v1.IPv6Protocol)
	if last == nil || len(last.Services) != 1 {
		t.Fatalf("IPv6 LastApplied = %v", last)
	}
	appliedMu.Lock()
	defer appliedMu.Unlock()
	if want := fmt.Sprintf("IPv6/%d", last.Generation); applied[len(applied)-1] != want {
		t.Errorf("OnApplied calls %v, want the last to be %s", applied, want)
	}
	if !p.health.Status().Healthy {
		t.Errorf("Healthy() false after a successful sync")
	}
}

func programmingCount(t *testing.T, reg *prometheus.Registry, family string) uint64 {
	t.Helper()
	m := metricWith(gather(t, reg), "kubeproxy_network_programming_duration_seconds", map[string]string{"ip_family": family})
	if m == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

func TestProxyNetworkProgrammingLatency(t *testing.T) {
	p := newTestProxy(t, time.Hour, nil)
	tr := p.Tracker()
	start := time.Now().Add(-10 * time.Minute)
	tr.start = start
	tr.OnService(nil, webService())
	old := webSlice("before-start", "10.1.0.1")
	old.Annotations = map[string]string{AnnotationLastChangeTriggerTime: start.Add(-time.Hour).Format(time.RFC3339Nano)}
	tr.OnEndpointSlice(nil, old)
	recent := webSlice("recent", "10.1.0.2")
	recent.Annotations = map[string]string{AnnotationLastChangeTriggerTime: start.Add(5 * time.Minute).Format(time.RFC3339Nano)}
	tr.OnEndpointSlice(nil, recent)
	p.start(t)
	if err := p.syncNow(t, false); err != nil {
		t.Fatal(err)
	}
	m := metricWith(gather(t, p.reg), "kubeproxy_network_programming_duration_seconds", map[string]string{"ip_family": "IPv4"})
	if m == nil || m.GetHistogram().GetSampleCount() != 1 {
		t.Fatalf("want one observation (the slice changed before the tracker started is not ours), got %v", m)
	}
	// It measured from the trigger time (about 5 minutes ago), not from the event.
	if sum := m.GetHistogram().GetSampleSum(); sum < 4*60 {
		t.Errorf("observed %vs, want about 300s", sum)
	}
	if programmingCount(t, p.reg, "IPv6") != 0 {
		t.Errorf("an IPv4 slice was observed for IPv6")
	}
}

func TestProxyMetrics(t *testing.T) {
	p := newTestProxy(t, time.Hour, nil)
	tr := p.Tracker()
	tr.OnNode(makeNode(thisNode, "", []string{"InternalIP=192.168.0.1"}))
	local := v1.ServiceInternalTrafficPolicyLocal
	// ITP Local, endpoints only elsewhere: counted as internal without local endpoints.
	tr.OnService(nil, makeService("ns", "itp", "10.0.0.1", withPort("", tcp, 80, 0), func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }))
	tr.OnEndpointSlice(nil, makeSlice("ns", "itp", "itp-1", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.1.0.1", node: "node-b"}))
	// ITP Local without any endpoint: not counted (upstream counts only Services that have endpoints).
	tr.OnService(nil, makeService("ns", "itp-empty", "10.0.0.2", withPort("", tcp, 80, 0), func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }))
	// ETP Local NodePort, endpoints only elsewhere: external.
	tr.OnService(nil, makeService("ns", "etp", "10.0.0.3", withPort("", tcp, 80, 30080), func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}))
	tr.OnEndpointSlice(nil, makeSlice("ns", "etp", "etp-1", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.1.0.3", node: "node-b"}))
	// ETP Local with a local endpoint: not counted.
	tr.OnService(nil, makeService("ns", "etp-ok", "10.0.0.4", withPort("", tcp, 80, 30081), func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}))
	tr.OnEndpointSlice(nil, makeSlice("ns", "etp-ok", "etp-ok-1", ipv4, []slicePortSpec{sp("", 80, tcp)}, epSpec{ip: "10.1.0.4", node: thisNode}))
	tr.OnService(makeService("ns", "etp-ok", "10.0.0.4"), makeService("ns", "etp-ok", "10.0.0.4", withPort("", tcp, 80, 30081), func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})) // a no-op update still counts as an event

	mfs := gather(t, p.reg)
	pending := func(name string) float64 { return mfs[name].GetMetric()[0].GetGauge().GetValue() }
	if got := pending("kubeproxy_sync_proxy_rules_service_changes_pending"); got != 4 {
		t.Errorf("service changes pending = %v, want 4", got)
	}
	if got := pending("kubeproxy_sync_proxy_rules_endpoint_changes_pending"); got != 3 {
		t.Errorf("endpoint changes pending = %v, want 3", got)
	}

	p.start(t)
	if err := p.syncNow(t, false); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/healthz", "/livez"} {
		p.Health().Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}

	mfs = gather(t, p.reg)
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"kubeproxy_sync_proxy_rules_duration_seconds":              {dto.MetricType_HISTOGRAM, []string{"ip_family"}},
		"kubeproxy_sync_full_proxy_rules_duration_seconds":         {dto.MetricType_HISTOGRAM, []string{"ip_family"}},
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        {dto.MetricType_GAUGE, []string{"ip_family"}},
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": {dto.MetricType_GAUGE, []string{"ip_family"}},
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      {dto.MetricType_GAUGE, []string{"ip_family", "traffic_policy"}},
		"kubeproxy_proxy_healthz_total":                            {dto.MetricType_COUNTER, []string{"code"}},
		"kubeproxy_proxy_livez_total":                              {dto.MetricType_COUNTER, []string{"code"}},
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      {dto.MetricType_GAUGE, nil},
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":        {dto.MetricType_COUNTER, nil},
		"kubeproxy_sync_proxy_rules_service_changes_pending":       {dto.MetricType_GAUGE, nil},
		"kubeproxy_sync_proxy_rules_service_changes_total":         {dto.MetricType_COUNTER, nil},
	}
	for name, w := range want {
		mf := mfs[name]
		if mf == nil {
			t.Errorf("metric %s missing", name)
			continue
		}
		if mf.GetType() != w.typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), w.typ)
		}
		var labels []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		if diff := cmp.Diff(w.labels, labels); diff != "" {
			t.Errorf("%s labels (-want +got):\n%s", name, diff)
		}
	}
	// Partial-sync and programming histograms exist once used; they are registered from the start.
	for _, name := range []string{"kubeproxy_sync_partial_proxy_rules_duration_seconds", "kubeproxy_network_programming_duration_seconds"} {
		if _, ok := mfs[name]; ok {
			continue
		}
		if err := p.reg.Register(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name}, []string{"ip_family"})); err == nil {
			t.Errorf("%s is not registered", name)
		}
	}

	value := func(name string, labels map[string]string) float64 {
		m := metricWith(mfs, name, labels)
		if m == nil {
			t.Errorf("%s%v missing", name, labels)
			return -1
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		}
		return -1
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kubeproxy_sync_proxy_rules_service_changes_total", nil, 5},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, 3},
		{"kubeproxy_sync_proxy_rules_service_changes_pending", nil, 0},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", nil, 0},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", map[string]string{"traffic_policy": "internal", "ip_family": "IPv4"}, 1},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", map[string]string{"traffic_policy": "external", "ip_family": "IPv4"}, 1},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", map[string]string{"traffic_policy": "internal", "ip_family": "IPv6"}, 0},
		{"kubeproxy_proxy_healthz_total", map[string]string{"code": "200"}, 1},
		{"kubeproxy_proxy_livez_total", map[string]string{"code": "200"}, 1},
	}
	for _, c := range checks {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, fam := range []string{"IPv4", "IPv6"} {
		if v := value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", map[string]string{"ip_family": fam}); v < float64(time.Now().Add(-time.Hour).Unix()) {
			t.Errorf("last sync timestamp for %s = %v", fam, v)
		}
		if v := value("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", map[string]string{"ip_family": fam}); v < float64(time.Now().Add(-time.Hour).Unix()) {
			t.Errorf("last queued timestamp for %s = %v", fam, v)
		}
	}
}

// TestProxyConcurrentEvents runs event producers, the sync loop, SyncNow callers and readers at once (run it
// with -race). The fake dataplanes check on every partial Apply that Changes leads to the snapshot's exact
// state; at the end the applied snapshot must equal the final state of the objects.
func TestProxyConcurrentEvents(t *testing.T) {
	p := newTestProxy(t, 3*time.Millisecond, nil) // frequent periodic full syncs too
	p.start(t)
	tr := p.Tracker()

	const producers, perProducer, rounds = 4, 5, 100
	svcFor := func(g, i int, gen int) *v1.Service {
		return makeService("ns", fmt.Sprintf("svc-%d-%d", g, i), "", dualStack(fmt.Sprintf("10.%d.%d.1", g, i), fmt.Sprintf("fd00:%d:%d::1", g, i)),
			withPort("p", tcp, int32(80+gen%3), 0))
	}
	sliceFor := func(g, i, gen int, at discovery.AddressType) *discovery.EndpointSlice {
		var eps []epSpec
		for k := 0; k <= gen%4; k++ {
			ip := fmt.Sprintf("10.%d.%d.%d", 100+g, i, 10+k)
			if at == ipv6 {
				ip = fmt.Sprintf("fd01:%d:%d::%d", g, i, 10+k)
			}
			eps = append(eps, epSpec{ip: ip, node: []string{thisNode, "node-b"}[k%2], ready: ptr(k%3 != 2)})
		}
		return makeSlice("ns", fmt.Sprintf("svc-%d-%d", g, i), fmt.Sprintf("svc-%d-%d-%s", g, i, at), at, []slicePortSpec{sp("p", 8080, tcp)}, eps...)
	}

	var wg sync.WaitGroup
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				for i := 0; i < perProducer; i++ {
					prevSvc, prevV4, prevV6 := svcFor(g, i, r-1), sliceFor(g, i, r-1, ipv4), sliceFor(g, i, r-1, ipv6)
					if r == 0 {
						prevSvc, prevV4, prevV6 = nil, nil, nil
					}
					if (r+i)%7 == 3 && r != rounds-1 { // sometimes delete and re-add
						tr.OnService(prevSvc, nil)
						tr.OnEndpointSlice(prevV4, nil)
						prevSvc, prevV4 = nil, nil
					}
					tr.OnService(prevSvc, svcFor(g, i, r))
					tr.OnEndpointSlice(prevV4, sliceFor(g, i, r, ipv4))
					tr.OnEndpointSlice(prevV6, sliceFor(g, i, r, ipv6))
				}
			}
		}()
	}
	wg.Add(2)
	go func() { // zone flapping forces rebuilds of everything
		defer wg.Done()
		for r := 0; r < rounds; r++ {
			tr.OnNode(makeNode(thisNode, fmt.Sprintf("zone-%d", r%2), []string{"InternalIP=192.168.0.1", "InternalIP=fd00::1"}))
		}
	}()
	go func() { // readers and synchronous syncs
		defer wg.Done()
		for r := 0; r < rounds; r++ {
			_ = p.SyncNow(context.Background(), r%5 == 0)
			_ = p.LastApplied(v1.IPv4Protocol)
			_ = p.health.Status().Healthy
			_, _ = tr.Pending()
			_ = p.Health().Status()
		}
	}()
	wg.Wait()
	if err := p.syncNow(t, false); err != nil {
		t.Fatal(err)
	}

	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		snap := p.LastApplied(fam)
		at := ipv4
		if fam == v1.IPv6Protocol {
			at = ipv6
		}
		want := map[ServicePortName][]string{}
		for g := 0; g < producers; g++ {
			for i := 0; i < perProducer; i++ {
				ps, _ := parseSlice(sliceFor(g, i, rounds-1, at), thisNode)
				want[spn("ns", fmt.Sprintf("svc-%d-%d", g, i), "p", tcp)] = epAddrs(endpointsFor([]*parsedSlice{ps}, fam, "p", tcp))
			}
		}
		got := map[ServicePortName][]string{}
		for name, sp := range snap.Services {
			got[name] = epAddrs(sp.Endpoints)
			if wantPort := int32(80 + (rounds-1)%3); sp.Port != wantPort {
				t.Errorf("%s %s: port %d, want %d", fam, name, sp.Port, wantPort)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s final snapshot (-want +got):\n%s", fam, diff)
		}
		if snap.Node.Zone != fmt.Sprintf("zone-%d", (rounds-1)%2) {
			t.Errorf("%s final zone %q", fam, snap.Node.Zone)
		}
	}
	for _, dp := range []*fakeDataplane{p.v4, p.v6} {
		partial := 0
		calls := dp.snapshotCalls()
		for _, c := range calls {
			if !c.full {
				partial++
			}
		}
		t.Logf("%d applies, %d partial", len(calls), partial)
		dp.check(t)
	}
}

// TestProxyFailingSyncsWithNothingQueued: health follows upstream's rule. A sync that fails while no
// change is pending (a periodic one) leaves the node healthy however long it lasts; a change that cannot
// reach the kernel within the timeout makes it unhealthy. Either way the sync loop counts as alive for the
// watchdog (a restart cannot make the kernel take the rules), and the failures are counted and shown.
func TestProxyFailingSyncsWithNothingQueued(t *testing.T) {
	var ahead atomic.Int64 // how far the health clock runs ahead of the real one
	p := newTestProxy(t, time.Hour, nil)
	p.health.now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	p.start(t)
	if err := p.syncNow(t, false); err != nil {
		t.Fatal(err)
	}
	p.v4.setFail(errors.New("iptables-restore: exit status 1"))
	if err := p.syncNow(t, true); err == nil {
		t.Fatal("the periodic sync did not fail")
	}
	ahead.Store(int64(3 * time.Hour)) // the timeout is 2 × the sync period (1 h)
	if !p.health.Status().Healthy {
		t.Error("failing syncs with nothing queued made the node unhealthy (upstream stays healthy)")
	}
	if !p.LoopAlive() {
		t.Error("failing syncs stopped the watchdog")
	}
	if n, since, err := p.SyncFailures(); n == 0 || since.IsZero() || err == nil || !strings.Contains(err.Error(), "iptables-restore") {
		t.Errorf("SyncFailures() = %d, %v, %v; want the failures and the kernel's error", n, since, err)
	}
	if m := metricWith(gather(t, p.reg), "kubeproxy_sync_proxy_rules_failures_total", map[string]string{"ip_family": "IPv4"}); m == nil || m.GetCounter().GetValue() < 1 {
		t.Errorf("kubeproxy_sync_proxy_rules_failures_total{ip_family=IPv4} = %v, want at least 1", m)
	}

	// A change that waits longer than the timeout: unhealthy, as upstream; the loop still turns.
	p.Tracker().OnService(nil, webService())
	ahead.Store(int64(6 * time.Hour))
	if p.health.Status().Healthy {
		t.Error("a change queued for 3 h without reaching the kernel left the node healthy")
	}
	if !p.LoopAlive() {
		t.Error("failing syncs with a change queued stopped the watchdog")
	}
	p.v4.setFail(nil)
	eventually(t, "the node to be healthy once the kernel takes the rules", func() bool { return p.health.Status().Healthy })
	eventually(t, "the failures to be cleared", func() bool { n, _, err := p.SyncFailures(); return n == 0 && err == nil })
}
