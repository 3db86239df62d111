package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kube-proxy/config"
	"kube-proxy/proxy/apitest"
	"kube-proxy/proxy/events"
)

// storedEvents lists the Events the fake API server holds, oldest first.
func storedEvents(t *testing.T, cs *fake.Clientset) []eventsv1.Event {
	t.Helper()
	l, err := cs.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(l.Items, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	return l.Items
}

func reasonsOf(evs []eventsv1.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+" "+e.Reason)
	}
	return out
}

// TestServerRecordsStartEvents: a starting Server records upstream's Events about its node: the warnings
// about its mode (a defaulted mode, mode ipvs), then Starting, each from controller kube-proxy about the
// Node.
func TestServerRecordsStartEvents(t *testing.T) {
	for _, tc := range []struct {
		mode      config.ProxyMode
		defaulted bool
		want      []string
	}{
		{mode: config.ModeIPTables, defaulted: true, want: []string{"Warning KubeProxyDefaultMode", "Normal Starting"}},
		{mode: config.ModeIPTables, want: []string{"Normal Starting"}},
		{mode: config.ModeIPVS, want: []string{"Warning IPVSDeprecation", "Normal Starting"}},
		{mode: config.ModeNFTables, want: []string{"Normal Starting"}},
	} {
		t.Run(fmt.Sprintf("%s defaulted=%v", tc.mode, tc.defaulted), func(t *testing.T) {
			cs := fake.NewClientset()
			cfg := config.Default()
			cfg.Mode = tc.mode
			cfg.HealthzBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
			s := NewServer(cfg, apitest.New(cs), thisNode, prometheus.NewRegistry(),
				[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: newFakeDataplane()}})
			s.ModeDefaulted = tc.defaulted
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			eventually(t, "the start events", func() bool { return len(storedEvents(t, cs)) >= len(tc.want) })
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := storedEvents(t, cs)
			if !slices.Equal(reasonsOf(got), tc.want) {
				t.Fatalf("events %v, want %v", reasonsOf(got), tc.want)
			}
			for _, e := range got {
				if e.Regarding != events.NodeRef(thisNode) || e.Namespace != "default" || e.ReportingController != "kube-proxy" ||
					!strings.HasPrefix(e.ReportingInstance, "kube-proxy-") || e.Action != "StartKubeProxy" {
					t.Errorf("event %s: regarding %+v in %q from %q/%q, action %q", e.Reason, e.Regarding, e.Namespace,
						e.ReportingController, e.ReportingInstance, e.Action)
				}
				if (e.Reason == "Starting") != (e.Note == "") {
					t.Errorf("event %s has note %q", e.Reason, e.Note)
				}
			}
		})
	}
}

// TestServerRecordsListenFailure: with bindAddressHardFail, a health or metrics port that is taken makes
// Run fail, and the Warning event upstream records for that server is written before Run returns (the
// daemon exits right after).
func TestServerRecordsListenFailure(t *testing.T) {
	for _, tc := range []struct{ server, reason string }{
		{"healthz", "FailedToStartProxierHealthcheck"},
		{"metrics", "FailedToStartMetricServer"},
	} {
		t.Run(tc.server, func(t *testing.T) {
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			cs := fake.NewClientset()
			cfg := config.Default()
			cfg.HealthzBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
			if tc.server == "healthz" {
				cfg.HealthzBindAddress = busy.Addr().String()
			} else {
				cfg.MetricsBindAddress = busy.Addr().String()
			}
			cfg.BindAddressHardFail = true
			s := NewServer(cfg, apitest.New(cs), thisNode, prometheus.NewRegistry(),
				[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: newFakeDataplane()}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = s.Run(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.server+" server") {
				t.Fatalf("Run = %v, want the %s listen error", err, tc.server)
			}
			got := storedEvents(t, cs)
			i := slices.IndexFunc(got, func(e eventsv1.Event) bool { return e.Reason == tc.reason })
			if i < 0 {
				t.Fatalf("events %v lack %s", reasonsOf(got), tc.reason)
			}
			if e := got[i]; e.Type != v1.EventTypeWarning || e.Regarding != events.NodeRef(thisNode) ||
				!strings.Contains(e.Note, "address already in use") {
				t.Errorf("%s event: type %s, regarding %+v, note %q", tc.reason, e.Type, e.Regarding, e.Note)
			}
		})
	}
}

// TestServerRecordsServiceHealthcheckFailure: a Service whose healthCheckNodePort is taken gets upstream's
// Warning event about the Service (action Listen), once while the port stays taken, however many syncs
// try again; once the port is free the server listens and answers.
func TestServerRecordsServiceHealthcheckFailure(t *testing.T) {
	busy, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := int32(busy.Addr().(*net.TCPAddr).Port)
	lb := func(try int32) *v1.Service { // each try changes a port, so that the proxy syncs again
		return makeService("shop", "web", "10.0.0.10", withPort("http", v1.ProtocolTCP, 80, 30080),
			withPort("try", v1.ProtocolTCP, 8000+try, 0), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = port
			})
	}
	cs := fake.NewClientset(makeNode(thisNode, "", []string{"InternalIP=192.168.0.1"}), lb(0))
	cfg := config.Default()
	cfg.HealthzBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
	fd := newFakeDataplane()
	s := NewServer(cfg, apitest.New(cs), thisNode, prometheus.NewRegistry(),
		[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: fd}})
	s.listenRetry = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	failures := func() []eventsv1.Event {
		var out []eventsv1.Event
		for _, e := range storedEvents(t, cs) {
			if e.Reason == "FailedToStartServiceHealthcheck" {
				out = append(out, e)
			}
		}
		return out
	}
	eventually(t, "the health-check failure event", func() bool { return len(failures()) > 0 })
	e := failures()[0]
	want := v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: "shop", Name: "web"}
	wantNote := fmt.Sprintf(`node %s failed to start healthcheck "shop/web" on port %d: `, thisNode, port)
	if e.Type != v1.EventTypeWarning || e.Regarding != want || e.Namespace != "shop" || e.Action != "Listen" ||
		e.ReportingController != "kube-proxy" || !strings.HasPrefix(e.Note, wantNote) || !strings.Contains(e.Note, "address already in use") {
		t.Fatalf("event: type %s, regarding %+v in %q, action %q, from %q, note %q", e.Type, e.Regarding, e.Namespace,
			e.Action, e.ReportingController, e.Note)
	}

	applies := func() int { fd.mu.Lock(); defer fd.mu.Unlock(); return len(fd.calls) }
	update := func(try int32) {
		t.Helper()
		n := applies()
		if _, err := cs.CoreV1().Services("shop").Update(context.Background(), lb(try), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a sync after the update", func() bool { return applies() > n })
	}
	update(1)
	update(2)
	time.Sleep(100 * time.Millisecond) // the Event of a sync is queued after its apply
	if n := len(failures()); n != 1 {
		t.Fatalf("%d failure events while the port stayed taken, want 1", n)
	}

	busy.Close()
	update(3)
	eventually(t, "the health-check server answering", func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable // no local endpoints
	})
	if n := len(failures()); n != 1 {
		t.Errorf("%d failure events, want still 1", n)
	}
}
