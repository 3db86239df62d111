package proxy

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kube-proxy/config"
)

// TestRegisterFeatureGates: kubernetes_feature_enabled has a sample for every gate upstream knows, 1 when
// it is on in the configuration and 0 when off, labelled with upstream's stage names.
func TestRegisterFeatureGates(t *testing.T) {
	cfg := config.Default()
	cfg.FeatureGates = map[string]bool{"AllAlpha": true, "ContextualLogging": false}
	reg := prometheus.NewPedanticRegistry()
	RegisterFeatureGates(reg, cfg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "kubernetes_feature_enabled" {
		t.Fatalf("gathered %v, want kubernetes_feature_enabled alone", mfs)
	}
	got := map[string]float64{}
	for _, m := range mfs[0].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		got[labels["name"]+"/"+labels["stage"]] = m.GetGauge().GetValue()
	}
	if n := len(cfg.KnownFeatureGates()); len(got) != n {
		t.Errorf("%d samples, want one per known gate (%d)", len(got), n)
	}
	for key, want := range map[string]float64{
		"AllAlpha/ALPHA": 1,
		"AllBeta/BETA":   0,
		"KubeProxyNFTablesLocalhostNodePorts/ALPHA": 1, // by AllAlpha
		"ContextualLogging/BETA":                    0, // set off
		"LoggingBetaOptions/BETA":                   1, // beta, on by default
		"NFTablesProxyMode/":                        1, // GA: no stage
		"KubeProxyIPVS/DEPRECATED":                  1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("kubernetes_feature_enabled{name/stage=%s} = %v (found %v), want %v", key, v, ok, want)
		}
	}
}
