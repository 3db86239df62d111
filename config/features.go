package config

import (
	"fmt"
	"sort"
	"strings"
)

// gateStage is the maturity of a feature gate.
type gateStage uint8

const (
	alpha gateStage = iota
	beta
	ga
	deprecated
)

func (s gateStage) String() string {
	switch s {
	case alpha:
		return "alpha"
	case beta:
		return "beta"
	case ga:
		return "GA"
	}
	return "deprecated"
}

// gateSpec is what upstream knows of one feature gate at UpstreamVersion.
type gateSpec struct {
	stage  gateStage
	def    bool
	locked bool     // the gate cannot be set to the other value
	deps   []string // gates that must be enabled while this one is
}

// The gates that switch whole stages: AllAlpha=true turns on every alpha gate that is not set
// explicitly, AllBeta does the same for beta gates.
const (
	allAlphaGate = "AllAlpha"
	allBetaGate  = "AllBeta"
)

// FeatureEnabled reports whether the feature gate name is on in c, as upstream decides it: the value in
// featureGates, else the value of AllAlpha or AllBeta for an alpha or beta gate when that is set, else
// upstream's default. Unknown gates, which Validate refuses, are off.
func (c *KubeProxyConfiguration) FeatureEnabled(name string) bool {
	return gateEnabled(c.FeatureGates, name)
}

func gateEnabled(gates map[string]bool, name string) bool {
	if v, ok := gates[name]; ok {
		return v
	}
	spec, ok := upstreamGates[name]
	if !ok {
		return false
	}
	if name != allAlphaGate && name != allBetaGate {
		if v, ok := gates[allAlphaGate]; ok && spec.stage == alpha {
			return v
		}
		if v, ok := gates[allBetaGate]; ok && spec.stage == beta {
			return v
		}
	}
	return spec.def
}

// validateFeatureGates checks featureGates as upstream's feature gate does when kube-proxy starts: every
// name must be a gate upstream knows, a gate locked to its default cannot be set to the other value, and
// every enabled gate's dependencies must be enabled. Setting a GA or deprecated gate is allowed with a
// warning, as upstream logs one.
func (v *validator) validateFeatureGates(gates map[string]bool) {
	names := make([]string, 0, len(gates))
	for name := range gates {
		names = append(names, name)
	}
	sort.Strings(names)
	bad := false
	for _, name := range names {
		f := joinPath("featureGates", name)
		if strings.TrimSpace(name) == "" {
			v.add("featureGates", "a feature gate name must not be empty")
			bad = true
			continue
		}
		spec, ok := upstreamGates[name]
		if !ok {
			v.add(f, "unknown feature gate %q%s", name, gateHint(name))
			bad = true
			continue
		}
		val := gates[name]
		if spec.locked && val != spec.def {
			v.add(f, "cannot set feature gate %s to %t: it is %s in v%s and locked to %t", name, val, spec.stage, UpstreamVersion, spec.def)
			bad = true
			continue
		}
		switch spec.stage {
		case ga:
			v.warn(f, "feature gate %s is GA; upstream will remove it in a future release, and then setting it is an error", name)
		case deprecated:
			v.warn(f, "feature gate %s is deprecated; upstream will remove it in a future release, and then setting it is an error", name)
		}
	}
	if bad {
		return // as upstream, dependencies are checked once every gate is known and settable
	}
	known := make([]string, 0, len(upstreamGates))
	for name := range upstreamGates {
		known = append(known, name)
	}
	sort.Strings(known)
	for _, name := range known {
		spec := upstreamGates[name]
		if len(spec.deps) == 0 || !gateEnabled(gates, name) {
			continue
		}
		var off []string
		for _, d := range spec.deps {
			if !gateEnabled(gates, d) {
				off = append(off, d)
			}
		}
		if len(off) > 0 {
			v.add(dependencyField(gates, name, spec, off), "feature gate %s is enabled, but depends on disabled feature gates: %s", name, strings.Join(off, ", "))
		}
	}
}

// dependencyField names the gate set in featureGates that a dependency error comes from: the dependent
// gate when it is set, else a disabled dependency that is set, else AllAlpha or AllBeta.
func dependencyField(gates map[string]bool, name string, spec gateSpec, off []string) string {
	candidates := append([]string{name}, off...)
	switch spec.stage {
	case alpha:
		candidates = append(candidates, allAlphaGate)
	case beta:
		candidates = append(candidates, allBetaGate)
	}
	for _, c := range candidates {
		if _, ok := gates[c]; ok {
			return joinPath("featureGates", c)
		}
	}
	return "featureGates"
}

// gateHint suggests the known gate a mistyped name probably meant.
func gateHint(name string) string {
	for known := range upstreamGates {
		if strings.EqualFold(known, name) {
			return fmt.Sprintf(" (gate names are case-sensitive: did you mean %q?)", known)
		}
	}
	return fmt.Sprintf("; upstream kube-proxy v%s has no such gate", UpstreamVersion)
}
