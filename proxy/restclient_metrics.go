package proxy

import (
	"context"
	"math"
	"net/url"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/klog/v2"
)

// This file exposes what upstream kube-proxy serves on /metrics besides its own kubeproxy_* metrics: client-go's
// rest_client_* metrics and kubernetes_build_info, under upstream's names, label names, label values and
// buckets, so that dashboards and alerts written for upstream work unchanged.
//
// client-go reports through package-level hooks (k8s.io/client-go/tools/metrics) that accept adapters once per
// process. So the collectors behind them are made once per process too and registered on every registry
// that asks (the daemon has one; tests make many); counts are the process's, whichever registry shows them.
//
// Upstream wires the same hooks through k8s.io/component-base, whose adapters register only on its global
// legacy registry (which also carries its own Go and process collectors); these adapters feed collectors we
// register on the registry we own instead.
//
// Upstream defines but never registers two more hooks (rest_client_dns_resolution_duration_seconds and
// rest_client_exec_plugin_policy_call_total); they are left as client-go's no-ops here too.

// clientGoMetrics are the collectors behind client-go's hooks.
type clientGoMetrics struct {
	requests             *prometheus.CounterVec
	retries              *prometheus.CounterVec
	requestLatency       *prometheus.HistogramVec
	rateLimiterLatency   *prometheus.HistogramVec
	requestSize          *prometheus.HistogramVec
	responseSize         *prometheus.HistogramVec
	execPluginTTL        prometheus.GaugeFunc
	execCertRotationAge  prometheus.Histogram
	execPluginCalls      *prometheus.CounterVec
	transportCache       prometheus.Gauge
	transportCreateCalls *prometheus.CounterVec
	transportCAReloads   *prometheus.CounterVec
	transportCertGCCalls prometheus.Counter
	transportCacheGC     *prometheus.CounterVec

	// certExpiry is when the exec plugin's client certificate expires; nil when there is none.
	certExpiry atomic.Pointer[time.Time]
}

var (
	clientGoOnce sync.Once
	clientGo     *clientGoMetrics
)

// installClientGoMetrics makes the process's client-go metrics and hands their adapters to client-go, once.
// It is called before the first client is made (so that its transport is counted) and again, doing
// nothing, whenever a registry asks for the metrics.
func installClientGoMetrics() *clientGoMetrics {
	clientGoOnce.Do(func() {
		clientGo = newClientGoMetrics()
		results := requestResults{clientGo.requests}
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestResult:                results,
			RequestRetry:                 requestRetries{clientGo.retries},
			RequestLatency:               urlLatency{clientGo.requestLatency},
			RateLimiterLatency:           urlLatency{clientGo.rateLimiterLatency},
			RequestSize:                  hostSizes{clientGo.requestSize},
			ResponseSize:                 hostSizes{clientGo.responseSize},
			ClientCertExpiry:             certExpiry{&clientGo.certExpiry},
			ClientCertRotationAge:        secondsObserver{clientGo.execCertRotationAge},
			ExecPluginCalls:              execCalls{clientGo.execPluginCalls},
			TransportCacheEntries:        intGauge{clientGo.transportCache},
			TransportCreateCalls:         resultCounter{clientGo.transportCreateCalls},
			TransportCAReloads:           caReloads{clientGo.transportCAReloads},
			TransportCertRotationGCCalls: plainCounter{clientGo.transportCertGCCalls},
			TransportCacheGCCalls:        resultCounter{clientGo.transportCacheGC},
		})
		// client-go keeps the first adapters it is given: another package of this binary may have won.
		if clientmetrics.RequestResult != clientmetrics.ResultMetric(results) {
			klog.ErrorS(nil, "Another package took client-go's metric hooks first; rest_client_* metrics stay empty")
		}
	})
	return clientGo
}

func newClientGoMetrics() *clientGoMetrics {
	// Upstream's buckets: quantiles over a fleet mixing both implementations line up.
	latencyBuckets := []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	sizeBuckets := []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216} // to 16 MiB
	verbHost := []string{"verb", "host"}
	m := &clientGoMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total",
			Help: "API requests that got a final answer, by HTTP status code (or <error>), method and host"},
			[]string{"code", "method", "host"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_request_retries_total",
			Help: "API requests retried, by the status code (or <error>) of the attempt, method and host"},
			[]string{"code", "verb", "host"}),
		requestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_duration_seconds",
			Help: "Seconds an API request took, retries included, by method and host", Buckets: latencyBuckets}, verbHost),
		rateLimiterLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_rate_limiter_duration_seconds",
			Help: "Seconds an API request waited for the client-side rate limiter, by method and host", Buckets: latencyBuckets}, verbHost),
		requestSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_size_bytes",
			Help: "Bytes of API request bodies, by method and host", Buckets: sizeBuckets}, verbHost),
		responseSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_response_size_bytes",
			Help: "Bytes of API response bodies, by method and host", Buckets: sizeBuckets}, verbHost),
		execCertRotationAge: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rest_client_exec_plugin_certificate_rotation_age",
			Help: "Seconds an exec plugin's client certificate had been valid when it was replaced",
			// 10 min, 30 min, 1 h, 4 h, 1 d, 1 w, 30 d, 90 d, 180 d, 360 d, 1440 d
			Buckets: []float64{600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000, 124416000}}),
		execPluginCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_exec_plugin_call_total",
			Help: "Runs of a credential exec plugin, by exit code and outcome"}, []string{"code", "call_status"}),
		transportCache: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rest_client_transport_cache_entries",
			Help: "HTTP transports in client-go's shared cache"}),
		transportCreateCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_transport_create_calls_total",
			Help: "Requests for an HTTP transport, by result: hit, miss, miss-gc or uncacheable"}, []string{"result"}),
		transportCAReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_transport_ca_reload_total",
			Help: "Attempts to reload the CA bundle of a transport, by result and reason"}, []string{"result", "reason"}),
		transportCertGCCalls: prometheus.NewCounter(prometheus.CounterOpts{Name: "rest_client_transport_cert_rotation_gc_calls_total",
			Help: "Certificate rotation goroutines stopped because their transport was garbage collected"}),
		transportCacheGC: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_transport_cache_gc_calls_total",
			Help: "Removals of garbage-collected transports from the cache, by result: deleted or skipped"}, []string{"result"}),
	}
	m.execPluginTTL = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rest_client_exec_plugin_ttl_seconds",
		Help: "Seconds until the exec plugin's client certificate expires (negative once expired, +Inf without one)"},
		func() float64 {
			if t := m.certExpiry.Load(); t != nil {
				return time.Until(*t).Seconds()
			}
			return math.Inf(1)
		})
	return m
}

func (m *clientGoMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.retries, m.requestLatency, m.rateLimiterLatency, m.requestSize,
		m.responseSize, m.execPluginTTL, m.execCertRotationAge, m.execPluginCalls, m.transportCache,
		m.transportCreateCalls, m.transportCAReloads, m.transportCertGCCalls, m.transportCacheGC}
}

// registerProcessMetrics registers on reg the process-wide metrics upstream serves besides its own: client-go's
// rest_client_* metrics and kubernetes_build_info.
func registerProcessMetrics(reg prometheus.Registerer) {
	reg.MustRegister(installClientGoMetrics().collectors()...)
	reg.MustRegister(buildInfoCollector{})
}

// The adapters: each turns one of client-go's hook interfaces into observations of a collector.

type requestResults struct{ v *prometheus.CounterVec }

func (a requestResults) Increment(_ context.Context, code, method, host string) {
	a.v.WithLabelValues(code, method, host).Inc()
}

type requestRetries struct{ v *prometheus.CounterVec }

func (a requestRetries) IncrementRetry(_ context.Context, code, method, host string) {
	a.v.WithLabelValues(code, method, host).Inc()
}

type urlLatency struct{ v *prometheus.HistogramVec }

func (a urlLatency) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	a.v.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}

type hostSizes struct{ v *prometheus.HistogramVec }

func (a hostSizes) Observe(_ context.Context, verb, host string, size float64) {
	a.v.WithLabelValues(verb, host).Observe(size)
}

type certExpiry struct{ p *atomic.Pointer[time.Time] }

func (a certExpiry) Set(expiry *time.Time) { a.p.Store(expiry) }

type secondsObserver struct{ h prometheus.Histogram }

func (a secondsObserver) Observe(d time.Duration) { a.h.Observe(d.Seconds()) }

type execCalls struct{ v *prometheus.CounterVec }

func (a execCalls) Increment(exitCode int, status string) {
	a.v.WithLabelValues(strconv.Itoa(exitCode), status).Inc()
}

type intGauge struct{ g prometheus.Gauge }

func (a intGauge) Observe(n int) { a.g.Set(float64(n)) }

type resultCounter struct{ v *prometheus.CounterVec }

func (a resultCounter) Increment(result string) { a.v.WithLabelValues(result).Inc() }

type caReloads struct{ v *prometheus.CounterVec }

func (a caReloads) Increment(result, reason string) { a.v.WithLabelValues(result, reason).Inc() }

type plainCounter struct{ c prometheus.Counter }

func (a plainCounter) Increment() { a.c.Inc() }

// BuildInfo is what kubernetes_build_info says about this binary. main sets it from its -ldflags values;
// a field left empty is taken, where it can be, from the VCS stamp the Go toolchain put in the binary.
type BuildInfo struct {
	// Version is the release, as `git describe --tags --dirty` prints it (e.g. v0.4.0 or
	// v0.4.0-3-g1a2b3c4-dirty); its leading numbers give the major and minor labels.
	Version string
	// Commit is the git commit the binary was built from.
	Commit string
	// TreeState is "clean" or "dirty"; empty means dirty when Version ends in "dirty", else the VCS stamp's.
	TreeState string
	// BuildDate is when the binary was built, as 2006-01-02T15:04:05Z.
	BuildDate string
}

// defaultVersion is reported when neither main nor the toolchain's stamp gives a version (main's own default).
const defaultVersion = "v0.0.0-dev"

var buildInfo atomic.Pointer[BuildInfo]

// SetBuildInfo records what kubernetes_build_info reports; it may be called before or after the metric is
// registered.
func SetBuildInfo(b BuildInfo) { buildInfo.Store(&b) }

// vcsStamp is the toolchain's record of the build: module version and vcs.* settings.
var vcsStamp = sync.OnceValue(func() map[string]string {
	s := map[string]string{}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return s
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		s["version"] = v
	}
	for _, kv := range bi.Settings {
		if strings.HasPrefix(kv.Key, "vcs.") {
			s[kv.Key] = kv.Value
		}
	}
	return s
})

// Completed fills b's empty fields from the VCS stamp.
func (b BuildInfo) Completed() BuildInfo {
	stamp := vcsStamp()
	or := func(v, fallback string) string {
		if v != "" {
			return v
		}
		return fallback
	}
	b.Version = or(b.Version, or(stamp["version"], defaultVersion))
	b.Commit = or(b.Commit, stamp["vcs.revision"])
	if b.TreeState == "" {
		switch {
		case strings.HasSuffix(b.Version, "dirty"):
			b.TreeState = "dirty"
		case stamp["vcs.modified"] == "true":
			b.TreeState = "dirty"
		case stamp["vcs.modified"] == "false":
			b.TreeState = "clean"
		}
	}
	return b
}

// majorMinor returns the leading numbers of a version such as v1.37.2 or 0.4; empty strings otherwise.
func majorMinor(version string) (major, minor string) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return "", ""
	}
	digits := func(s string) string {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return s[:i]
	}
	major, minor = digits(parts[0]), digits(parts[1])
	if major == "" || major != parts[0] || minor == "" {
		return "", ""
	}
	return major, minor
}

var buildInfoDesc = prometheus.NewDesc("kubernetes_build_info",
	"Always 1; the labels say which version and commit of kube-proxy this is, and the Go toolchain and platform it was built with",
	[]string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"},
	nil)

// buildInfoCollector reports kubernetes_build_info with upstream's labels, from what SetBuildInfo recorded.
type buildInfoCollector struct{}

func (buildInfoCollector) Describe(ch chan<- *prometheus.Desc) { ch <- buildInfoDesc }

func (buildInfoCollector) Collect(ch chan<- prometheus.Metric) {
	var b BuildInfo
	if p := buildInfo.Load(); p != nil {
		b = *p
	}
	b = b.Completed()
	major, minor := majorMinor(b.Version)
	ch <- prometheus.MustNewConstMetric(buildInfoDesc, prometheus.GaugeValue, 1,
		major, minor, b.Version, b.Commit, b.TreeState, b.BuildDate,
		runtime.Version(), runtime.Compiler, runtime.GOOS+"/"+runtime.GOARCH)
}
