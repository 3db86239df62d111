package rules

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nfacct"
	"kube-proxy/rules/nftables"
)

// modeSet says in which modes upstream registers a metric (its RegisterMetrics).
type modeSet uint8

const (
	inIPTables     modeSet = 1 << iota
	inIPVS                 // mode ipvs
	inNFTables             // mode nftables
	inNFTablesGate         // mode nftables with the KubeProxyNFTablesLocalhostNodePorts gate on
	inAll          = inIPTables | inIPVS | inNFTables | inNFTablesGate
	inAnyNFTables  = inNFTables | inNFTablesGate
)

// metricSpec is how a metric appears on /metrics.
type metricSpec struct {
	typ     dto.MetricType
	help    string
	labels  []string // sorted
	buckets []float64
	modes   modeSet
}

// The buckets of upstream's histograms.
var (
	syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)
	// component-base's MergeBuckets puts a 0 in front of the merged lists.
	programmingBuckets = slices.Concat([]float64{0}, prometheus.LinearBuckets(0.25, 0.25, 2), prometheus.LinearBuckets(1, 1, 59),
		prometheus.LinearBuckets(60, 5, 12), prometheus.LinearBuckets(120, 30, 7))
)

const (
	counter   = dto.MetricType_COUNTER
	gauge     = dto.MetricType_GAUGE
	histogram = dto.MetricType_HISTOGRAM
)

// upstreamMetrics are the metrics upstream kube-proxy v1.37.2 registers, as read in
// k8s.io/kubernetes pkg/proxy/metrics/metrics.go (definitions and RegisterMetrics), with the help text
// component-base exposes (the stability level in front), and component-base's kubernetes_feature_enabled
// (metrics/prometheus/feature). Windows' kernelspace metrics are left out: this implementation runs on
// Linux only. TestUpstreamMetricsTable checks this table against upstream's sources when the module cache
// holds them.
var upstreamMetrics = map[string]metricSpec{
	"kubeproxy_sync_proxy_rules_duration_seconds": {histogram, "[ALPHA] SyncProxyRules latency in seconds",
		[]string{"ip_family"}, syncBuckets, inAll},
	"kubeproxy_sync_full_proxy_rules_duration_seconds": {histogram, "[ALPHA] SyncProxyRules latency in seconds for full resyncs",
		[]string{"ip_family"}, syncBuckets, inIPTables | inAnyNFTables},
	"kubeproxy_sync_partial_proxy_rules_duration_seconds": {histogram, "[ALPHA] SyncProxyRules latency in seconds for partial resyncs",
		[]string{"ip_family"}, syncBuckets, inIPTables | inAnyNFTables},
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds": {gauge, "[ALPHA] The last time proxy rules were successfully synced",
		[]string{"ip_family"}, nil, inAll},
	"kubeproxy_network_programming_duration_seconds": {histogram, "[ALPHA] In Cluster Network Programming Latency in seconds",
		[]string{"ip_family"}, programmingBuckets, inAll},
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending": {gauge, "[ALPHA] Pending proxy rules Endpoint changes", nil, nil, inAll},
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":   {counter, "[ALPHA] Cumulative proxy rules Endpoint changes", nil, nil, inAll},
	"kubeproxy_sync_proxy_rules_service_changes_pending":  {gauge, "[ALPHA] Pending proxy rules Service changes", nil, nil, inAll},
	"kubeproxy_sync_proxy_rules_service_changes_total":    {counter, "[ALPHA] Cumulative proxy rules Service changes", nil, nil, inAll},
	"kubeproxy_iptables_ct_state_invalid_dropped_packets_total": {counter,
		"[ALPHA] packets dropped by iptables to work around conntrack problems", nil, nil, inIPTables},
	"kubeproxy_sync_proxy_rules_iptables_restore_failures_total": {counter, "[ALPHA] Cumulative proxy iptables restore failures",
		[]string{"ip_family"}, nil, inIPTables | inIPVS},
	"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": {counter,
		"[ALPHA] Cumulative proxy iptables partial restore failures", []string{"ip_family"}, nil, inIPTables},
	"kubeproxy_sync_proxy_rules_iptables_total": {gauge, "[ALPHA] Total number of iptables rules owned by kube-proxy",
		[]string{"ip_family", "table"}, nil, inIPTables},
	"kubeproxy_sync_proxy_rules_iptables_last": {gauge, "[ALPHA] Number of iptables rules written by kube-proxy in last sync",
		[]string{"ip_family", "table"}, nil, inIPTables},
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total": {counter, "[ALPHA] Cumulative proxy nftables sync failures",
		[]string{"ip_family"}, nil, inAnyNFTables},
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": {counter, "[ALPHA] Cumulative proxy nftables cleanup failures",
		[]string{"ip_family"}, nil, inAnyNFTables},
	"kubeproxy_proxy_healthz_total": {counter, "[ALPHA] Cumulative proxy healthz HTTP status", []string{"code"}, nil, inAll},
	"kubeproxy_proxy_livez_total":   {counter, "[ALPHA] Cumulative proxy livez HTTP status", []string{"code"}, nil, inAll},
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": {gauge, "[ALPHA] The last time a sync of proxy rules was queued",
		[]string{"ip_family"}, nil, inAll},
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total": {gauge,
		"[ALPHA] Number of services with a Local traffic policy and no endpoints", []string{"ip_family", "traffic_policy"}, nil, inAll},
	"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": {counter,
		"[ALPHA] Number of packets accepted on nodeports of loopback interface", nil, nil, inIPTables},
	"kubeproxy_nftables_localhost_nodeport_listeners": {gauge, "[ALPHA] Number of active localhost NodePort userspace proxy listeners.",
		[]string{"ip_family"}, nil, inNFTablesGate},
	"kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total": {counter,
		"[ALPHA] Number of localhost NodePort userspace proxy listener creation failures.", []string{"ip_family"}, nil, inNFTablesGate},
	"kubeproxy_nftables_localhost_nodeport_rejected_packets_total": {counter,
		"[ALPHA] Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
		[]string{"ip_family", "protocol"}, nil, inNFTablesGate},
	"kubeproxy_conntrack_reconciler_sync_duration_seconds": {histogram, "[ALPHA] ReconcileConntrackFlowsLatency latency in seconds",
		[]string{"ip_family"}, syncBuckets, inAll},
	"kubeproxy_conntrack_reconciler_deleted_entries_total": {counter, "[ALPHA] Cumulative conntrack flows deleted by conntrack reconciler",
		[]string{"ip_family"}, nil, inAll},
	"kubernetes_feature_enabled": {gauge, "[BETA] This metric records the data about the stage and enablement of a k8s feature.",
		[]string{"name", "stage"}, nil, inAll},
}

// kernelOnly are upstream's metrics whose samples come from the kernel only (counters of the kube-proxy
// nftables table): without one, only their descriptions are compared here; e2e/userspace reads them.
var kernelOnly = []string{"kubeproxy_nftables_localhost_nodeport_rejected_packets_total"}

// ownMetric reports the kubeproxy_ metrics of ours that upstream does not have (docs/METRICS.md).
func ownMetric(name string) bool {
	switch name {
	case "kubeproxy_skipped_api_objects_total", "kubeproxy_sync_proxy_rules_failures_total", "kubeproxy_config_reloads_total",
		"kubeproxy_iptables_rules_removed_externally_total", "kubeproxy_iptables_backend_info", "kubeproxy_nftables_changed_externally_total":
		return true
	}
	return strings.HasPrefix(name, "kubeproxy_userspace_") // mode userspace's proxy engine, and nftables' localhost one
}

// recorder registers collectors on a registry and keeps them, so that the test can give each labelled
// metric a sample and read the descriptions of those that have none.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// fakeCounters are nfacct counters that exist.
type fakeCounters struct{}

func (fakeCounters) Ensure(string) error { return nil }
func (fakeCounters) Get(name string) (nfacct.Counter, error) {
	return nfacct.Counter{Name: name, Packets: 7, Bytes: 700}, nil
}

// modeMetrics registers what the daemon registers in mode: the proxy's metrics (proxy.New, every mode),
// the feature gates (proxy.NewServer, every mode) and the mode's own, made as New's mode constructors make them.
func modeMetrics(t *testing.T, mode modeSet) *recorder {
	t.Helper()
	rec := &recorder{Registry: prometheus.NewPedanticRegistry()}
	cfg := config.Default()
	proxy.New(proxy.Options{NodeName: "node-a", SyncPeriod: time.Minute, MinSyncPeriod: time.Second, Registry: rec})
	proxy.RegisterFeatureGates(rec, cfg)
	switch mode {
	case inIPTables:
		iptables.NewMetrics(rec, fakeCounters{})
	case inIPVS:
		ipvs.NewMetrics(rec)
	case inNFTables, inNFTablesGate:
		nftables.NewMetrics(rec, mode == inNFTablesGate)
	}
	conntrack.NewMetrics(rec)
	return rec
}

// exported returns what rec exports: each metric family, after giving every labelled metric one sample
// (labels set to ""), and the descriptions of all metrics by name.
func exported(t *testing.T, rec *recorder) (map[string]*dto.MetricFamily, map[string]string) {
	t.Helper()
	descs := map[string]string{}
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			descs[descName(d)] = d.String()
		}
		var vec *prometheus.MetricVec
		switch v := c.(type) {
		case *prometheus.CounterVec:
			vec = v.MetricVec
		case *prometheus.GaugeVec:
			vec = v.MetricVec
		case *prometheus.HistogramVec:
			vec = v.MetricVec
		}
		if vec == nil {
			continue
		}
		made := false
		for n := 0; n <= 8 && !made; n++ {
			_, err := vec.GetMetricWithLabelValues(make([]string, n)...)
			made = err == nil
		}
		if !made {
			t.Fatalf("could not give %v a sample", descs)
		}
	}
	mfs, err := rec.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out, descs
}

var descFields = regexp.MustCompile(`^Desc\{fqName: "([^"]*)", help: "((?:[^"\\]|\\.)*)", unit: "[^"]*", constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}\}$`)

func descName(d *prometheus.Desc) string {
	if m := descFields.FindStringSubmatch(d.String()); m != nil {
		return m[1]
	}
	return d.String()
}

// TestMetricsAsUpstream registers each mode's metrics as the daemon does and compares every metric
// upstream registers in that mode with upstream's name, type, help, label names and buckets; any other
// kubeproxy_ metric must be one of ours (ownMetric).
func TestMetricsAsUpstream(t *testing.T) {
	for _, m := range []struct {
		name string
		mode modeSet
	}{{"iptables", inIPTables}, {"ipvs", inIPVS}, {"nftables", inNFTables}, {"nftables with localhost NodePorts", inNFTablesGate}} {
		t.Run(m.name, func(t *testing.T) {
			fams, descs := exported(t, modeMetrics(t, m.mode))
			for name, want := range upstreamMetrics {
				if want.modes&m.mode == 0 {
					continue
				}
				mf := fams[name]
				if mf == nil && slices.Contains(kernelOnly, name) {
					d := descFields.FindStringSubmatch(descs[name])
					if d == nil {
						t.Errorf("%s: not registered", name)
						continue
					}
					labels := strings.Split(d[3], ",")
					sort.Strings(labels)
					if help := strings.ReplaceAll(d[2], `\"`, `"`); help != want.help || !slices.Equal(labels, want.labels) {
						t.Errorf("%s: help %q labels %v, want %q %v", name, help, labels, want.help, want.labels)
					}
					continue
				}
				if mf == nil {
					t.Errorf("%s: not exported", name)
					continue
				}
				if diff := compare(mf, want); diff != "" {
					t.Errorf("%s: %s", name, diff)
				}
			}
			for name := range descs {
				if _, upstream := upstreamMetrics[name]; !upstream && strings.HasPrefix(name, "kubeproxy_") && !ownMetric(name) {
					t.Errorf("%s: neither upstream's nor one of ours", name)
				}
			}
		})
	}
}

// compare returns how an exported metric family differs from spec, "" when it does not.
func compare(mf *dto.MetricFamily, want metricSpec) string {
	var diffs []string
	if mf.GetType() != want.typ {
		diffs = append(diffs, fmt.Sprintf("type %v, want %v", mf.GetType(), want.typ))
	}
	if mf.GetHelp() != want.help {
		diffs = append(diffs, fmt.Sprintf("help %q, want %q", mf.GetHelp(), want.help))
	}
	for _, m := range mf.GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName())
		}
		sort.Strings(labels)
		if !slices.Equal(labels, want.labels) {
			diffs = append(diffs, fmt.Sprintf("labels %v, want %v", labels, want.labels))
		}
		if want.typ == histogram {
			var bounds []float64
			for _, b := range m.GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			if !slices.Equal(bounds, want.buckets) {
				diffs = append(diffs, fmt.Sprintf("buckets %v, want %v", bounds, want.buckets))
			}
		}
		break
	}
	return strings.Join(diffs, "; ")
}
