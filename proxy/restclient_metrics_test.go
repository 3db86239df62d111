package proxy

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/config"
)

// fakeAPIServer answers GET /api/v1/services with an empty list and everything else with 503 (without
// Retry-After, so client-go does not retry). It returns the kubeconfig path of a client for it and the
// host:port client-go puts in its host label.
func fakeAPIServer(t *testing.T) (kubeconfig, host string) {
	t.Helper()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/v1/services" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`)
			return
		}
		http.Error(w, "the API server is unavailable", http.StatusServiceUnavailable)
	}))
	t.Cleanup(api.Close)
	u, err := url.Parse(api.URL)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q}
users:
- name: kube-proxy
  user: {}
contexts:
- name: test
  context: {cluster: test, user: kube-proxy}
current-context: test
`, api.URL)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, u.Host
}

// newMetricsTestClient builds the daemon's client (NewClient, the default clientConnection) for kubeconfig.
func newMetricsTestClient(t *testing.T, kubeconfig string) API {
	t.Helper()
	cc := config.Default().ClientConnection
	cc.Kubeconfig = kubeconfig
	client, err := NewClient(cc, "", "kube-proxy/test")
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func newMetricsTestServer(client API) *Server {
	return NewServer(config.Default(), client, thisNode, prometheus.NewRegistry(),
		[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: newFakeDataplane()}})
}

// TestRESTClientMetrics makes real requests through the daemon's client and finds client-go's request
// metrics under upstream's names, labels and label values on the registry of every Server of the process
// (client-go takes its metric adapters once per process; tests make many Servers).
func TestRESTClientMetrics(t *testing.T) {
	kubeconfig, host := fakeAPIServer(t)
	client := newMetricsTestClient(t, kubeconfig)
	first := newMetricsTestServer(client)

	ctx := context.Background()
	if _, err := client.ListServices(ctx, "", metav1.ListOptions{}); err != nil {
		t.Fatalf("listing Services: %v", err)
	}
	if _, err := client.GetNode(ctx, thisNode); err == nil {
		t.Fatal("getting the Node succeeded against a server that answers 503")
	}
	second := newMetricsTestServer(client) // made after the requests: still sees them

	for name, reg := range map[string]*prometheus.Registry{"first": first.Registry, "second": second.Registry} {
		t.Run(name, func(t *testing.T) {
			mfs := gather(t, reg)
			for _, code := range []string{"200", "503"} {
				want := map[string]string{"code": code, "method": "GET", "host": host}
				m := metricWith(mfs, "rest_client_requests_total", want)
				if m == nil || m.GetCounter().GetValue() != 1 {
					t.Errorf("rest_client_requests_total with %v = %v, want 1; have:\n%s", want, m, describe(mfs, "rest_client_requests_total"))
				}
			}
			if mfs["rest_client_requests_total"].GetType() != dto.MetricType_COUNTER {
				t.Errorf("rest_client_requests_total is a %v, want a counter", mfs["rest_client_requests_total"].GetType())
			}
			byVerb := map[string]string{"verb": "GET", "host": host}
			for name, count := range map[string]uint64{
				"rest_client_request_duration_seconds":      2,
				"rest_client_rate_limiter_duration_seconds": 2,
				"rest_client_request_size_bytes":            2,
				"rest_client_response_size_bytes":           1, // client-go keeps no body of the 503
			} {
				m := metricWith(mfs, name, byVerb)
				if m == nil || m.GetHistogram().GetSampleCount() != count {
					t.Errorf("%s with %v has %d samples, want %d; have:\n%s", name, byVerb,
						m.GetHistogram().GetSampleCount(), count, describe(mfs, name))
				}
			}
			// Upstream's buckets, so that quantiles over a mixed fleet line up.
			if m := metricWith(mfs, "rest_client_request_duration_seconds", byVerb); m != nil {
				var les []float64
				for _, b := range m.GetHistogram().GetBucket() {
					les = append(les, b.GetUpperBound())
				}
				want := []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
				if fmt.Sprint(les) != fmt.Sprint(want) {
					t.Errorf("rest_client_request_duration_seconds buckets %v, want %v", les, want)
				}
			}
			// Metrics that exist whether or not an exec plugin or a certificate rotation ever happened.
			if m := metricWith(mfs, "rest_client_exec_plugin_ttl_seconds", nil); m == nil || !math.IsInf(m.GetGauge().GetValue(), 1) {
				t.Errorf("rest_client_exec_plugin_ttl_seconds = %v, want +Inf without an exec plugin", m)
			}
			for _, name := range []string{"rest_client_exec_plugin_certificate_rotation_age",
				"rest_client_transport_cert_rotation_gc_calls_total", "rest_client_transport_cache_entries"} {
				if mfs[name] == nil {
					t.Errorf("no %s", name)
				}
			}
		})
	}
}

// TestBuildInfoMetric finds kubernetes_build_info with upstream's labels on a Server's registry.
func TestBuildInfoMetric(t *testing.T) {
	mfs := gather(t, newMetricsTestServer(nil).Registry)
	mf := mfs["kubernetes_build_info"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatalf("kubernetes_build_info: %v, want one metric", mf)
	}
	m := mf.GetMetric()[0]
	if m.GetGauge().GetValue() != 1 {
		t.Errorf("kubernetes_build_info = %v, want 1", m.GetGauge().GetValue())
	}
	labels := map[string]string{}
	var names []string
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
		names = append(names, l.GetName())
	}
	sort.Strings(names)
	wantNames := []string{"build_date", "compiler", "git_commit", "git_tree_state", "git_version", "go_version",
		"major", "minor", "platform"}
	if fmt.Sprint(names) != fmt.Sprint(wantNames) {
		t.Errorf("kubernetes_build_info labels %v, want %v", names, wantNames)
	}
	for k, want := range map[string]string{"go_version": runtime.Version(), "compiler": runtime.Compiler,
		"platform": runtime.GOOS + "/" + runtime.GOARCH} {
		if labels[k] != want {
			t.Errorf("kubernetes_build_info{%s=%q}, want %q", k, labels[k], want)
		}
	}
	if labels["git_version"] == "" {
		t.Errorf("kubernetes_build_info has no git_version: %v", labels)
	}
}

// TestSetBuildInfo checks that main's version and commit reach kubernetes_build_info, with major and minor
// taken from the version and the tree state from git describe's -dirty.
func TestSetBuildInfo(t *testing.T) {
	t.Cleanup(func() { buildInfo.Store(nil) })
	reg := newMetricsTestServer(nil).Registry
	SetBuildInfo(BuildInfo{Version: "v0.4.1-3-g1a2b3c4-dirty", Commit: "1a2b3c4", BuildDate: "2026-01-02T03:04:05Z"})
	want := map[string]string{"major": "0", "minor": "4", "git_version": "v0.4.1-3-g1a2b3c4-dirty",
		"git_commit": "1a2b3c4", "git_tree_state": "dirty", "build_date": "2026-01-02T03:04:05Z"}
	if m := metricWith(gather(t, reg), "kubernetes_build_info", want); m == nil {
		t.Errorf("no kubernetes_build_info with %v; have:\n%s", want, describe(gather(t, reg), "kubernetes_build_info"))
	}
}

func TestMajorMinor(t *testing.T) {
	for _, c := range []struct{ version, major, minor string }{
		{"v1.37.2", "1", "37"},
		{"v0.4.0-3-g1a2b3c4-dirty", "0", "4"},
		{"0.5", "0", "5"},
		{"v2.1-rc.1", "2", "1"},
		{"37d1c14", "", ""}, // git describe --always without a tag
		{"37d1c14-dirty", "", ""},
		{"v0.0.0-dev", "0", "0"},
		{"", "", ""},
		{"v.1.2", "", ""},
	} {
		if major, minor := majorMinor(c.version); major != c.major || minor != c.minor {
			t.Errorf("majorMinor(%q) = %q, %q; want %q, %q", c.version, major, minor, c.major, c.minor)
		}
	}
}

// describe lists a family's metrics for failure messages.
func describe(mfs map[string]*dto.MetricFamily, name string) string {
	if mfs[name] == nil {
		return "  (no " + name + ")"
	}
	s := ""
	for _, m := range mfs[name].GetMetric() {
		s += "  " + m.String() + "\n"
	}
	return s
}
