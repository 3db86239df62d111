package rules

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

// perFamily builds a dataplane for each IP family of cfg, primary first, whose iptables tools work in
// backend: build gets the family and its runner. The primary family's failure (its tools or build) is an
// error; another family's makes the node single-stack, as upstream runs.
func perFamily(cfg *config.KubeProxyConfiguration, backend xtables.Backend,
	build func(family v1.IPFamily, runner *xtables.Runner) (proxy.Dataplane, error)) ([]proxy.FamilyDataplane, error) {
	var out []proxy.FamilyDataplane
	for i, family := range proxy.Families(cfg) {
		runner, err := xtables.UsableRunner(backend, family)
		var dp proxy.Dataplane
		if err == nil {
			dp, err = build(family, runner)
		}
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
