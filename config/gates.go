package config

import "sort"

// FeatureGate is one feature gate upstream kube-proxy knows, as its kubernetes_feature_enabled metric
// reports it.
type FeatureGate struct {
	Name string
	// Stage is the gate's maturity as upstream names it: "ALPHA", "BETA", "" (GA) or "DEPRECATED".
	Stage string
	// Enabled says whether the gate is on in the configuration (FeatureEnabled).
	Enabled bool
}

// KnownFeatureGates returns every feature gate upstream kube-proxy v1.37.2 knows (AllAlpha and AllBeta
// included), sorted by name, each with its stage and whether it is on in c: what upstream's feature gate
// exports as kubernetes_feature_enabled.
func (c *KubeProxyConfiguration) KnownFeatureGates() []FeatureGate {
	out := make([]FeatureGate, 0, len(upstreamGates))
	for name, spec := range upstreamGates {
		out = append(out, FeatureGate{Name: name, Stage: spec.stage.prerelease(), Enabled: gateEnabled(c.FeatureGates, name)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// prerelease is the stage as component-base's featuregate names it.
func (s gateStage) prerelease() string {
	switch s {
	case alpha:
		return "ALPHA"
	case beta:
		return "BETA"
	case ga:
		return ""
	}
	return "DEPRECATED"
}
