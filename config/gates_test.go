package config

import "testing"

func TestKnownFeatureGates(t *testing.T) {
	tests := []struct {
		name  string
		gates map[string]bool
		want  map[string]FeatureGate // a few of the result's entries
	}{
		{name: "defaults", want: map[string]FeatureGate{
			"AllAlpha":                            {Name: "AllAlpha", Stage: "ALPHA"},
			"AllBeta":                             {Name: "AllBeta", Stage: "BETA"},
			"KubeProxyNFTablesLocalhostNodePorts": {Name: "KubeProxyNFTablesLocalhostNodePorts", Stage: "ALPHA"},
			"ContextualLogging":                   {Name: "ContextualLogging", Stage: "BETA", Enabled: true},
			"NFTablesProxyMode":                   {Name: "NFTablesProxyMode", Stage: "", Enabled: true},
			"KubeProxyIPVS":                       {Name: "KubeProxyIPVS", Stage: "DEPRECATED", Enabled: true},
		}},
		{name: "set in the file, and AllAlpha", gates: map[string]bool{"AllAlpha": true, "ContextualLogging": false}, want: map[string]FeatureGate{
			"AllAlpha":                            {Name: "AllAlpha", Stage: "ALPHA", Enabled: true},
			"KubeProxyNFTablesLocalhostNodePorts": {Name: "KubeProxyNFTablesLocalhostNodePorts", Stage: "ALPHA", Enabled: true},
			"ContextualLogging":                   {Name: "ContextualLogging", Stage: "BETA"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.FeatureGates = tt.gates
			got := c.KnownFeatureGates()
			if len(got) != len(upstreamGates) {
				t.Errorf("%d gates, want every one upstream knows (%d)", len(got), len(upstreamGates))
			}
			byName := map[string]FeatureGate{}
			for i, g := range got {
				if i > 0 && got[i-1].Name >= g.Name {
					t.Errorf("not sorted: %s before %s", got[i-1].Name, g.Name)
				}
				byName[g.Name] = g
			}
			for name, want := range tt.want {
				if byName[name] != want {
					t.Errorf("%s = %+v, want %+v", name, byName[name], want)
				}
			}
		})
	}
}
