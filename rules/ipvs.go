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
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/xtables"
)

// newIPVS sets up mode ipvs as mode iptables is set up: the kernel checked once for IPVS, the scheduler
// and ipsets, the iptables backend the node already uses (IPVS mode still masquerades and filters with
// iptables), and a dataplane per family whose iptables works, dual-stack when both do.
func newIPVS(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer, _ engine.Sockets) ([]proxy.FamilyDataplane, error) {
	families := proxy.Families(cfg)
	primary, err := ipvs.ConfigFrom(cfg, families[0])
	if err != nil {
		return nil, err
	}
	if err := ipvs.Usable(primary.Scheduler); err != nil {
		return nil, err
	}
	backend, why, err := xtables.Detect(ctx)
	if err != nil {
		return nil, err
	}
	klog.InfoS("IPVS mode", "node", nodeName, "scheduler", primary.Scheduler, "iptablesBackend", backend, "reason", why)
	metrics := ipvs.NewMetrics(reg)
	ctMetrics := conntrack.NewMetrics(reg)
	return perFamily(cfg, backend, func(family v1.IPFamily, runner *xtables.Runner) (proxy.Dataplane, error) {
		c, err := ipvs.ConfigFrom(cfg, family)
		if err != nil {
			return nil, err
		}
		return ipvs.New(ctx, c, runner, conntrack.NewCleaner(family, ctMetrics), metrics)
	})
}
