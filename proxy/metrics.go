package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kube-proxy/config"
)

// Metrics are the proxy-level Prometheus metrics, under upstream kube-proxy's names and labels, registered
// on a registry the caller owns. Dataplane-specific metrics (iptables restore failures, rule counts) are
// registered by the dataplanes.
type Metrics struct {
	SyncDuration        *prometheus.HistogramVec
	SyncFullDuration    *prometheus.HistogramVec
	SyncPartialDuration *prometheus.HistogramVec
	LastSyncTimestamp   *prometheus.GaugeVec
	LastQueuedTimestamp *prometheus.GaugeVec
	NetworkProgramming  *prometheus.HistogramVec
	NoLocalEndpoints    *prometheus.GaugeVec
	HealthzTotal        *prometheus.CounterVec
	LivezTotal          *prometheus.CounterVec
	// SkippedObjects counts unusable API objects and fields that were skipped, by kind (ours, not upstream's).
	SkippedObjects *prometheus.CounterVec
	// SyncFailures counts failed applies of a family's snapshot (ours; upstream counts only iptables-restore
	// failures, which the iptables and ipvs dataplanes count too).
	SyncFailures *prometheus.CounterVec
	// ConfigReloads counts SIGHUP reloads by result: "applied", "invalid", "restart-required" (ours).
	ConfigReloads *prometheus.CounterVec
}

const subsystem = "kubeproxy"

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	family := []string{"ip_family"}
	m := &Metrics{
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_duration_seconds", Help: "[ALPHA] SyncProxyRules latency in seconds", Buckets: syncBuckets}, family),
		SyncFullDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem,
			Name: "sync_full_proxy_rules_duration_seconds", Help: "[ALPHA] SyncProxyRules latency in seconds for full resyncs", Buckets: syncBuckets}, family),
		SyncPartialDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem,
			Name: "sync_partial_proxy_rules_duration_seconds", Help: "[ALPHA] SyncProxyRules latency in seconds for partial resyncs", Buckets: syncBuckets}, family),
		LastSyncTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_last_timestamp_seconds", Help: "[ALPHA] The last time proxy rules were successfully synced"}, family),
		LastQueuedTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_last_queued_timestamp_seconds", Help: "[ALPHA] The last time a sync of proxy rules was queued"}, family),
		NetworkProgramming: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem,
			Name: "network_programming_duration_seconds", Help: "[ALPHA] In Cluster Network Programming Latency in seconds",
			Buckets: networkProgrammingBuckets()}, family),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_no_local_endpoints_total", Help: "[ALPHA] Number of services with a Local traffic policy and no endpoints"},
			[]string{"traffic_policy", "ip_family"}),
		HealthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "proxy_healthz_total", Help: "[ALPHA] Cumulative proxy healthz HTTP status"}, []string{"code"}),
		LivezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "proxy_livez_total", Help: "[ALPHA] Cumulative proxy livez HTTP status"}, []string{"code"}),
		SkippedObjects: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "skipped_api_objects_total", Help: "Unusable API objects or fields that were skipped, by kind"}, []string{"kind"}),
		SyncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_failures_total", Help: "Syncs whose rules the kernel did not take, by IP family"}, family),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "config_reloads_total", Help: "Configuration reloads (SIGHUP) by result"}, []string{"result"}),
	}
	reg.MustRegister(m.SyncDuration, m.SyncFullDuration, m.SyncPartialDuration, m.LastSyncTimestamp,
		m.LastQueuedTimestamp, m.NetworkProgramming, m.NoLocalEndpoints, m.HealthzTotal, m.LivezTotal,
		m.SkippedObjects, m.SyncFailures, m.ConfigReloads)
	return m
}

// RegisterFeatureGates exports kubernetes_feature_enabled{name,stage} on reg, as upstream kube-proxy's
// feature gate does: 1 for each gate upstream knows that is on in cfg, 0 for each that is off. Feature
// gates change only with a restart, so the values are set once.
func RegisterFeatureGates(reg prometheus.Registerer, cfg *config.KubeProxyConfiguration) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubernetes", Name: "feature_enabled",
		Help: "[BETA] This metric records the data about the stage and enablement of a k8s feature."},
		[]string{"name", "stage"})
	for _, f := range cfg.KnownFeatureGates() {
		v := 0.0
		if f.Enabled {
			v = 1
		}
		g.WithLabelValues(f.Name, f.Stage).Set(v)
	}
	reg.MustRegister(g)
}

// registerTrackerMetrics exposes the tracker's change counts under upstream's names.
func registerTrackerMetrics(reg prometheus.Registerer, t *Tracker) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_endpoint_changes_pending", Help: "[ALPHA] Pending proxy rules Endpoint changes"},
			func() float64 { _, e := t.Pending(); return float64(e) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_endpoint_changes_total", Help: "[ALPHA] Cumulative proxy rules Endpoint changes"},
			func() float64 { return float64(t.Stats().EndpointChanges) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_service_changes_pending", Help: "[ALPHA] Pending proxy rules Service changes"},
			func() float64 { s, _ := t.Pending(); return float64(s) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Subsystem: subsystem,
			Name: "sync_proxy_rules_service_changes_total", Help: "[ALPHA] Cumulative proxy rules Service changes"},
			func() float64 { return float64(t.Stats().ServiceChanges) }),
	)
}

// networkProgrammingBuckets are upstream's: 0 (component-base's MergeBuckets starts with it), 0.25 s and
// 0.5 s, every second to 59 s, every 5 s to 115 s, every 30 s to 5 min.
func networkProgrammingBuckets() []float64 {
	b := []float64{0, 0.25, 0.5}
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

func seconds(d time.Duration) float64 { return d.Seconds() }
