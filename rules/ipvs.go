package rules

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/ipvs"
)

// newIPVS sets up mode ipvs: a dataplane per family, dual-stack when the second family's iptables works
// too (IPVS mode still needs iptables for masquerading and filtering).
func newIPVS(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer) ([]proxy.FamilyDataplane, error) {
	var out []proxy.FamilyDataplane
	for i, family := range proxy.Families(cfg) {
		dp, err := ipvs.New(ctx, cfg, family, nodeName, reg)
		if err != nil {
			if i == 0 {
				return nil, err
			}
			klog.InfoS("Running single-stack", "ipFamily", family, "reason", err.Error())
			continue
		}
		out = append(out, proxy.FamilyDataplane{Family: family, Dataplane: dp})
	}
	return out, nil
}
