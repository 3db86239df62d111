package harness

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/floor"
	"kube-proxy/e2e/probe"
)

// Eventually polls cond every 100 ms until it holds, failing t after timeout with what and cond's last
// detail.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, detail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// HitForTest is HitWith bounded by a minute, failing t when the harness itself fails.
func HitForTest(t testing.TB, from *NetNS, network, addr string, n int, opts HitOptions) []HitResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := HitWith(ctx, from, network, addr, n, opts)
	if err != nil {
		t.Fatalf("hit %s %s: %v", network, addr, err)
	}
	return res
}

// ExpectSpread checks that every connection was answered, by the pods in want only, each at least once,
// and that each pod saw the source address seen(pod) (nil, or "" for a pod, skips that check).
func ExpectSpread(t testing.TB, label string, res []HitResult, want []string, seen func(pod string) string) {
	t.Helper()
	counts := CountHits(res)
	var bad []string
	for k, n := range counts {
		if !slices.Contains(want, k) && n > 0 {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	for _, p := range want {
		if counts[p] == 0 {
			bad = append(bad, "no "+p)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: %s; want answers from %v only (%s)", label, FormatHits(counts), want, strings.Join(bad, ", "))
	}
	if seen == nil {
		return
	}
	for _, r := range res {
		if r.Err != "" {
			continue
		}
		host, _, _ := net.SplitHostPort(r.Seen)
		if w := seen(r.Pod); w != "" && host != w {
			t.Errorf("%s: %s saw the client as %s, want %s", label, r.Pod, host, w)
			return
		}
	}
}

// ExpectAllFail checks that every connection failed with class (see HitResult.Err).
func ExpectAllFail(t testing.TB, label string, res []HitResult, class string) {
	t.Helper()
	counts := CountHits(res)
	if counts["ERR:"+class] != len(res) {
		t.Errorf("%s: %s; want every one to fail with %q", label, FormatHits(counts), class)
	}
}

// ExpectNoFailures logs how many connections were made and fails t if any failed, but for isolated
// timeouts at this host's floor (the rule of package kube-proxy/e2e/floor).
func ExpectNoFailures(t testing.TB, label string, res []HitResult) {
	t.Helper()
	fails := probe.Failures(res)
	t.Logf("%s: %d connections, %d failed", label, len(res), fails)
	if fails == 0 {
		return
	}
	if probe.WithinFloor(res) {
		t.Logf("%s: %d isolated timeouts tolerated, at most one per %d connections: this host's floor", label, fails, floor.ConnectionsPerTimeout)
		return
	}
	var shown []string
	for _, r := range res {
		if r.Err != "" && len(shown) < 5 {
			shown = append(shown, r.Local+": "+r.Detail)
		}
	}
	t.Errorf("%s: %d of %d connections failed: %s; the first:\n%s", label, fails, len(res), FormatHits(CountHits(res)), strings.Join(shown, "\n"))
}

// PodNames returns "pod<i>" for each i: the names the pod servers answer with.
func PodNames(pods ...int) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = "pod" + strconv.Itoa(p)
	}
	return out
}

// GatewayOf returns the node's address on a pod's link ("pod<i>"): what the pod sees as the source of a
// connection the node masqueraded.
func GatewayOf(pod string) string {
	i, _ := strconv.Atoi(strings.TrimPrefix(pod, "pod"))
	return PodGatewayIP(i)
}

// MetricValue returns the value of the first sample of name in a Prometheus text body whose labels
// contain every one of labels (each written `key="value"`): probe.MetricValue.
func MetricValue(body, name string, labels ...string) (float64, bool) {
	return probe.MetricValue(body, name, labels...)
}

// CheckHealthCheckNodePort fetches a Service's health check node port from ns through NodeIP until it
// answers wantCode (15 s at most), then checks upstream's JSON body and the
// X-Load-Balancing-Endpoint-Weight header for wantLocal local endpoints.
func CheckHealthCheckNodePort(t testing.TB, from *NetNS, svc *corev1.Service, wantCode, wantLocal int) {
	t.Helper()
	CheckHealthCheckNodePortAt(t, from, NodeIP, svc, wantCode, wantLocal)
}

// CheckHealthCheckNodePortAt is CheckHealthCheckNodePort through the node address nodeIP (NodeBIP: node
// B's proxy).
func CheckHealthCheckNodePortAt(t testing.TB, from *NetNS, nodeIP string, svc *corev1.Service, wantCode, wantLocal int) {
	t.Helper()
	port := svc.Spec.HealthCheckNodePort
	if port == 0 {
		t.Fatalf("Service %s has no health check node port", svc.Name)
	}
	url := "http://" + HostPort(nodeIP, port) + "/"
	var code int
	var body, weight string
	Eventually(t, "health check of "+svc.Name+" at "+nodeIP, 15*time.Second, func() (bool, string) {
		resp, err := from.HTTPClient().Get(url)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		code, body, weight = resp.StatusCode, string(b), resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
		return code == wantCode, "status " + strconv.Itoa(code)
	})
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"" + svc.Namespace + "\",\n\t\t\"name\": \"" + svc.Name +
		"\"\n\t},\n\t\"localEndpoints\": " + strconv.Itoa(wantLocal) + ",\n\t\"serviceProxyHealthy\": true\n}"
	if body != want {
		t.Errorf("health check of %s at %s: body\n%s\nwant\n%s", svc.Name, nodeIP, body, want)
	}
	if weight != strconv.Itoa(wantLocal) {
		t.Errorf("health check of %s at %s: X-Load-Balancing-Endpoint-Weight %q, want %d", svc.Name, nodeIP, weight, wantLocal)
	}
	if code != http.StatusOK && code != http.StatusServiceUnavailable {
		t.Errorf("health check of %s at %s: status %d", svc.Name, nodeIP, code)
	}
}

// Metric fetches the daemon's /metrics (failing t when it cannot) and returns the value of the first
// sample of name whose labels contain every one of labels, as MetricValue.
func (d *Daemon) Metric(t testing.TB, name string, labels ...string) (float64, bool) {
	t.Helper()
	code, body, err := d.Get(10249, "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return MetricValue(body, name, labels...)
}

// MetricOverFamilies sums a metric's samples labelled ip_family="IPv4" and "IPv6" (see Metric); it fails
// t when the daemon exports no IPv4 sample of it.
func (d *Daemon) MetricOverFamilies(t testing.TB, name string) float64 {
	t.Helper()
	var sum float64
	for _, fam := range []string{"IPv4", "IPv6"} {
		v, found := d.Metric(t, name, `ip_family="`+fam+`"`)
		if !found && fam == "IPv4" {
			t.Fatalf("no IPv4 %s in /metrics", name)
		}
		sum += v
	}
	return sum
}
