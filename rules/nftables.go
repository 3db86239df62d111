package rules

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/nftables"
)

// newNFTables sets up mode nftables: a dataplane per family, dual-stack unless the kernel's IPv6 is off.
func newNFTables(_ context.Context, cfg *config.KubeProxyConfiguration, _ string, reg prometheus.Registerer, _ engine.Sockets) ([]proxy.FamilyDataplane, error) {
	if err := nftables.Usable(); err != nil {
		return nil, err
	}
	metrics := nftables.NewMetrics(reg, nftables.LocalhostNodePortsGate(cfg))
	ctMetrics := conntrack.NewMetrics(reg)
	var out []proxy.FamilyDataplane
	for i, family := range proxy.Families(cfg) {
		if err := nftables.FamilyUsable(family); err != nil {
			if i == 0 {
				return nil, err
			}
			klog.InfoS("Running single-stack", "ipFamily", family, "reason", err.Error())
			continue
		}
		ncfg, err := nftables.ConfigFrom(cfg, family)
		if err != nil {
			return nil, err
		}
		dp, err := nftables.New(ncfg, conntrack.NewCleaner(family, ctMetrics), metrics)
		if err != nil {
			return nil, err
		}
		out = append(out, proxy.FamilyDataplane{Family: family, Dataplane: dp})
	}
	return out, nil
}
