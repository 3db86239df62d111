package rules

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/nfacct"
	"kube-proxy/rules/xtables"
)

// newIPTables sets up mode iptables: the conntrack sysctls, the backend the node already uses, and a
// dataplane per family whose tools work here. Like upstream, it runs dual-stack whenever both iptables and
// ip6tables work, and single-stack when only the primary family does.
func newIPTables(ctx context.Context, cfg *config.KubeProxyConfiguration, _ string, reg prometheus.Registerer, _ engine.Sockets) ([]proxy.FamilyDataplane, error) {
	backend, why, err := xtables.Detect(ctx)
	if err != nil {
		return nil, err
	}
	klog.InfoS("Using iptables backend", "backend", backend, "reason", why)
	var acct iptables.Accounting // nil without nfacct: no counting rules, no metrics read from them
	if c, err := nfacct.New(0); err != nil {
		klog.ErrorS(err, "Cannot reach nfacct; the rules will not count packets for the nfacct-based metrics")
	} else {
		acct = c
	}
	metrics := iptables.NewMetrics(reg, acct)
	ctMetrics := conntrack.NewMetrics(reg)
	return perFamily(cfg, backend, func(family v1.IPFamily, runner *xtables.Runner) (proxy.Dataplane, error) {
		icfg, err := iptables.ConfigFrom(cfg, family)
		if err != nil {
			return nil, err
		}
		metrics.SetBackend(string(backend), family)
		if backend == xtables.BackendNFT {
			// iptables-nft-restore's time grows faster than its input: big syncs go in chunks.
			icfg.ChunkLines = 2500
		}
		return iptables.NewDataplane(icfg, runner, conntrack.NewCleaner(family, ctMetrics), acct, metrics), nil
	})
}
