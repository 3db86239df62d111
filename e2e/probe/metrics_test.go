package probe

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

const exposition = `# HELP kubeproxy_sync_proxy_rules_failures_total Failed syncs.
# TYPE kubeproxy_sync_proxy_rules_failures_total counter
kubeproxy_sync_proxy_rules_failures_total{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_failures_total{ip_family="IPv6"} 2
kubeproxy_sync_proxy_rules_failures_total_extra 100
kubeproxy_config_reloads_total{result="success"} 4
kubeproxy_config_reloads_total{result="refused"} 1
kubeproxy_config_reloads_total{result="broken"} not-a-number
go_goroutines 41
go_goroutines_other 7
`

func TestMetricValue(t *testing.T) {
	tests := []struct {
		name   string
		labels []string
		want   float64
		found  bool
	}{
		{"go_goroutines", nil, 41, true},
		{"kubeproxy_sync_proxy_rules_failures_total", nil, 3, true},
		{"kubeproxy_sync_proxy_rules_failures_total", []string{`ip_family="IPv6"`}, 2, true},
		{"kubeproxy_config_reloads_total", []string{"result", "refused"}, 1, true},
		{"kubeproxy_config_reloads_total", []string{"broken"}, 0, false},
		{"kubeproxy_config_reloads_total", []string{"nothing"}, 0, false},
		{"go_gor", nil, 0, false},
		{"absent", nil, 0, false},
	}
	for _, tc := range tests {
		v, found := MetricValue(exposition, tc.name, tc.labels...)
		if v != tc.want || found != tc.found {
			t.Errorf("MetricValue(%s, %v) = %v, %v; want %v, %v", tc.name, tc.labels, v, found, tc.want, tc.found)
		}
	}
}

func TestSumMetric(t *testing.T) {
	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kubeproxy_sync_proxy_rules_failures_total", nil, 5},
		{"kubeproxy_sync_proxy_rules_failures_total", []string{`ip_family="IPv4"`}, 3},
		{"kubeproxy_sync_proxy_rules_failures_total", []string{""}, 5},
		{"kubeproxy_config_reloads_total", nil, 5}, // the unparsable sample is skipped
		{"go_goroutines", nil, 41},
		{"absent", nil, 0},
	}
	for _, tc := range tests {
		if got := SumMetric(exposition, tc.name, tc.labels...); got != tc.want {
			t.Errorf("SumMetric(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte(exposition))
	}))
	defer srv.Close()
	code, body, err := Get(context.Background(), srv.Client(), srv.URL+"/metrics")
	if err != nil || code != http.StatusOK || SumMetric(body, "go_goroutines") != 41 {
		t.Errorf("Get /metrics = %d, %d bytes, %v", code, len(body), err)
	}
	if code, _, err := Get(context.Background(), srv.Client(), srv.URL+"/other"); err != nil || code != http.StatusNotFound {
		t.Errorf("Get /other = %d, %v; want 404", code, err)
	}
	srv.Close()
	if _, _, err := Get(context.Background(), http.DefaultClient, srv.URL+"/metrics"); err == nil {
		t.Error("Get from a closed server did not fail")
	}
}
