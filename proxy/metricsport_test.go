package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/prometheus/slis"

	"kube-proxy/config"
	"kube-proxy/proxy/zpages"
	"kube-proxy/proxy/zpages/zpagestest"
)

// metricsPort serves a Server's metrics port handler for cfg, with a command line of one flag.
func metricsPort(t *testing.T, cfg *config.KubeProxyConfiguration) *httptest.Server {
	t.Helper()
	s := NewServer(cfg, nil, thisNode, prometheus.NewRegistry(),
		[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: newFakeDataplane()}})
	s.Flags = pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	s.Flags.String("hostname-override", "node-a", "")
	srv := httptest.NewServer(s.metricsHandler())
	t.Cleanup(srv.Close)
	return srv
}

// ask renders the answer to method path in the form of the upstream captures.
func ask(t *testing.T, srv *httptest.Server, method, path string) string {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return zpagestest.Dump(resp)
}

// processStartTime is what differs between two processes' /metrics/slis; Vary is added by newer
// client_golang releases than upstream's.
var processStartTime = regexp.MustCompile(`(?m)^(Process-Start-Time-Unix: |process_start_time_seconds ).*$|^Vary: .*\n`)

// TestMetricsPortHealthAsUpstream: the metrics port's /healthz (with ?verbose and ?exclude), /healthz/ping
// and /metrics/slis answer as upstream v1.37.2's did (testdata/upstream-metricsport), the SLI metrics
// counting the ping checks the /healthz requests ran, and a DELETE resetting them.
func TestMetricsPortHealthAsUpstream(t *testing.T) {
	slis.ResetHealthMetrics() // process-wide, as upstream's
	t.Cleanup(slis.ResetHealthMetrics)
	srv := metricsPort(t, config.Default())
	for _, tc := range []struct{ file, method, path string }{
		{"healthz", "GET", "/healthz"},
		{"healthz-verbose", "GET", "/healthz?verbose"},
		{"healthz-exclude", "GET", "/healthz?verbose&exclude=ping&exclude=nope&exclude=abc"},
		{"healthz-ping", "GET", "/healthz/ping"},
		{"slis", "GET", "/metrics/slis"},
		{"slis-delete", "DELETE", "/metrics/slis"},
		{"slis-after-delete", "GET", "/metrics/slis"},
	} {
		want, err := os.ReadFile(filepath.Join("testdata", "upstream-metricsport", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		got := ask(t, srv, tc.method, tc.path)
		if diff := cmp.Diff(processStartTime.ReplaceAllString(string(want), "$1"), processStartTime.ReplaceAllString(got, "$1")); diff != "" {
			t.Errorf("%s %s differs from upstream's (-upstream +ours):\n%s", tc.method, tc.path, diff)
		}
	}
}

// TestMetricsPortStatusPages: /flagz and /statusz are served while their feature gates are on (the
// default, beta since 1.36) and not when they are off; /statusz lists the paths served before it, as
// upstream's (so /debug with enableProfiling, and never /statusz); /flagz shows the command line.
func TestMetricsPortStatusPages(t *testing.T) {
	for _, tc := range []struct {
		name       string
		gates      map[string]bool
		profiling  bool
		flagz      int
		statusz    int
		statuszFor []string
	}{
		{name: "default gates", flagz: 200, statusz: 200,
			statuszFor: []string{"/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"}},
		{name: "profiling", profiling: true, flagz: 200, statusz: 200,
			statuszFor: []string{"/configz", "/debug", "/flagz", "/healthz", "/metrics", "/proxyMode"}},
		{name: "ComponentFlagz off", gates: map[string]bool{"ComponentFlagz": false}, flagz: 404, statusz: 200,
			statuszFor: []string{"/configz", "/healthz", "/metrics", "/proxyMode"}},
		{name: "ComponentStatusz off", gates: map[string]bool{"ComponentStatusz": false}, flagz: 200, statusz: 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.FeatureGates = tc.gates
			cfg.EnableProfiling = tc.profiling
			srv := metricsPort(t, cfg)
			flagz := ask(t, srv, "GET", "/flagz")
			if !strings.HasPrefix(flagz, fmt.Sprint(tc.flagz)) {
				t.Fatalf("/flagz: %s", flagz)
			}
			if tc.flagz == 200 && !regexp.MustCompile(`\nhostname-override(:|: |=| )node-a\n`).MatchString(flagz) {
				t.Errorf("/flagz does not show the command line: %s", flagz)
			}
			req, _ := http.NewRequest("GET", srv.URL+"/statusz", nil)
			req.Header.Set("Accept", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.statusz {
				t.Fatalf("/statusz: %d", resp.StatusCode)
			}
			if tc.statusz != 200 {
				return
			}
			var st zpages.Statusz
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(st.Paths, tc.statuszFor) || st.BinaryVersion != "1.37.2" || st.EmulationVersion != "1.37" ||
				st.StartTime.IsZero() || !strings.HasPrefix(st.GoVersion, "go") {
				t.Errorf("/statusz: %+v, want paths %v and versions 1.37.2, 1.37", st, tc.statuszFor)
			}
		})
	}
}
