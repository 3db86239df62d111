package rules

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/xtables"
)

// newIPTables sets up mode iptables: the conntrack sysctls, the backend the node already uses, and a
// dataplane per family whose tools work here. Like upstream, it runs dual-stack whenever both iptables and
// ip6tables work, and single-stack when only the primary family does.
func newIPTables(ctx context.Context, cfg *config.KubeProxyConfiguration, reg prometheus.Registerer) ([]proxy.FamilyDataplane, error) {
	backend, why, err := xtables.Detect(ctx)
	if err != nil {
		return nil, err
	}
	klog.InfoS("Using iptables backend", "backend", backend, "reason", why)
	metrics := iptables.NewMetrics(reg)
	ctMetrics := conntrack.NewMetrics(reg)
	var out []proxy.FamilyDataplane
	for i, family := range proxy.Families(cfg) {
		runner, err := xtables.UsableRunner(backend, family)
		if err != nil {
			if i == 0 {
				return nil, err
			}
			klog.InfoS("Running single-stack", "ipFamily", family, "reason", err.Error())
			continue
		}
		icfg, err := iptables.ConfigFrom(cfg, family)
		if err != nil {
			return nil, err
		}
		metrics.SetBackend(string(backend), family)
		if backend == xtables.BackendNFT {
			// iptables-nft-restore's time grows faster than its input: big syncs go in chunks.
			icfg.ChunkLines = 2500
		}
		dp := iptables.NewDataplane(icfg, runner, conntrack.NewCleaner(family, ctMetrics), metrics)
		out = append(out, proxy.FamilyDataplane{Family: family, Dataplane: dp})
	}
	return out, nil
}
