package config

import (
	"os"
	"strings"
	"testing"
)

// loadWith runs Complete the way main does, with body (after the header) as the config file when it
// is not empty, and the given flags. It returns the file's path too.
func loadWith(t *testing.T, body string, args ...string) (*KubeProxyConfiguration, []*FieldError, error, string) {
	t.Helper()
	o, fs := newFlagSet(t)
	var path string
	if body != "" {
		path = writeFile(t, header+body)
		args = append([]string{"--config=" + path}, args...)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("Parse: %v", err)
	}
	c, warns, err := o.Complete(fs)
	return c, warns, err, path
}

// checkFieldErrors compares problems with want; a want line of 0 means the problem comes from a flag,
// so it names no file.
func checkFieldErrors(t *testing.T, what string, got []*FieldError, path string, want []wantErr) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d %s, want %d: %v", len(got), what, len(want), got)
	}
	for i, w := range want {
		g := got[i]
		file := path
		if w.line == 0 {
			file = ""
		}
		if g.File != file || g.Line != w.line || g.Field != w.field || !strings.Contains(g.Msg, w.msg) {
			t.Errorf("%s %d = {File:%q Line:%d Field:%q Msg:%q}\n     want {File:%q Line:%d Field:%q Msg:~%q}",
				what, i, g.File, g.Line, g.Field, g.Msg, file, w.line, w.field, w.msg)
		}
	}
}

// TestFeatureGates checks featureGates against upstream v1.37.2's gates, from the file and from
// --feature-gates alike. The expected outcomes are what upstream kube-proxy v1.37.2 does with the same
// gates (unknown, locked, dependencies, AllAlpha/AllBeta), with this implementation's messages.
func TestFeatureGates(t *testing.T) {
	tests := []struct {
		name  string
		file  string // body after the header; "" runs without --config
		args  []string
		want  []wantErr
		warns []wantErr
	}{{
		name: "unknown gate in the file",
		file: "featureGates:\n  NoSuchGate: true\n",
		want: []wantErr{{4, "featureGates.NoSuchGate", `unknown feature gate "NoSuchGate"; upstream kube-proxy v1.37 has no such gate`}},
	}, {
		name: "unknown gate from the flag",
		args: []string{"--feature-gates=NoSuchGate=true"},
		want: []wantErr{{0, "featureGates.NoSuchGate", `unknown feature gate "NoSuchGate"; upstream kube-proxy v1.37 has no such gate (set by --feature-gates)`}},
	}, {
		name: "a bad gate of the file is the file's even when the flag sets others",
		file: "mode: iptables\nfeatureGates: {Bogus: true}\n",
		args: []string{"--feature-gates=ContextualLogging=false"},
		want: []wantErr{{4, "featureGates.Bogus", `unknown feature gate "Bogus"`}},
	}, {
		name: "names are case-sensitive",
		file: "featureGates: {nftablesProxyMode: true}\n",
		want: []wantErr{{3, "featureGates.nftablesProxyMode", `did you mean "NFTablesProxyMode"?`}},
	}, {
		name: "a locked GA gate cannot be turned off",
		file: "featureGates: {NFTablesProxyMode: false}\n",
		want: []wantErr{{3, "featureGates.NFTablesProxyMode", "cannot set feature gate NFTablesProxyMode to false: it is GA in v1.37 and locked to true"}},
	}, {
		name: "nor from the flag",
		args: []string{"--feature-gates=MultiCIDRServiceAllocator=false"},
		want: []wantErr{{0, "featureGates.MultiCIDRServiceAllocator", "locked to true (set by --feature-gates)"}},
	}, {
		name:  "a GA gate at its value loads with a warning",
		file:  "featureGates: {NFTablesProxyMode: true}\n",
		warns: []wantErr{{3, "featureGates.NFTablesProxyMode", "feature gate NFTablesProxyMode is GA; upstream will remove it"}},
	}, {
		name:  "an unlocked GA gate may be turned off",
		args:  []string{"--feature-gates=AllowServiceExternalIPs=false"},
		warns: []wantErr{{0, "featureGates.AllowServiceExternalIPs", "is GA; upstream will remove it in a future release, and then setting it is an error (set by --feature-gates)"}},
	}, {
		name:  "a deprecated gate loads with a warning",
		file:  "featureGates: {KubeProxyIPVS: true}\n",
		warns: []wantErr{{3, "featureGates.KubeProxyIPVS", "deprecated"}},
	}, {
		name: "alpha and beta gates load quietly",
		file: "featureGates: {KubeProxyNFTablesLocalhostNodePorts: true, ContextualLogging: false}\n",
	}, {
		name: "turning off a gate another one needs",
		file: "featureGates:\n  APIServerIdentity: false\n",
		want: []wantErr{{4, "featureGates.APIServerIdentity", "feature gate UnknownVersionInteroperabilityProxy is enabled, but depends on disabled feature gates: APIServerIdentity"}},
	}, {
		// Upstream v1.37.2 refuses AllAlpha=true alone the same way.
		name: "AllAlpha turns on alpha gates whose dependency is off",
		args: []string{"--feature-gates=AllAlpha=true"},
		want: []wantErr{
			{0, "featureGates.AllAlpha", "CompositePodGroup is enabled, but depends on disabled feature gates: GenericWorkload"},
			{0, "featureGates.AllAlpha", "PodGroupPreemptionPolicy is enabled"},
			{0, "featureGates.AllAlpha", "TopologyAwareWorkloadScheduling is enabled"},
			{0, "featureGates.AllAlpha", "WorkloadWithJob is enabled"},
		},
	}, {
		name: "AllAlpha with the dependency on",
		file: "featureGates: {AllAlpha: true, GenericWorkload: true}\n",
	}, {
		name: "AllBeta=false turns the json log format off, as LoggingBetaOptions=false does",
		file: "featureGates: {AllBeta: false}\nlogging: {format: json}\n",
		want: []wantErr{{4, "logging.format", "needs the LoggingBetaOptions feature gate"}},
	}, {
		name: "AllAlpha enables the logging options",
		file: "featureGates: {AllAlpha: true, GenericWorkload: true}\nlogging: {options: {text: {splitStream: true}}}\n",
	}, {
		name: "the string form of v1.10 and older",
		file: "featureGates: \"SupportIPVSProxyMode=true\"\n",
		want: []wantErr{{3, "featureGates", "comma-separated string is the format of v1.10 and older"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, warns, err, path := loadWith(t, tt.file, tt.args...)
			if tt.want == nil && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tt.want != nil {
				if err == nil {
					t.Fatal("no error")
				}
				checkFieldErrors(t, "error", fieldErrors(t, err), path, tt.want)
				return
			}
			checkFieldErrors(t, "warning", warns, path, tt.warns)
		})
	}
}

// TestReloadRefusesUnknownGate: a reload (Complete again after the file changed) fails with the message a
// start with that file gets, so the daemon keeps its running configuration and says why.
func TestReloadRefusesUnknownGate(t *testing.T) {
	o, fs := newFlagSet(t)
	path := writeFile(t, header+"mode: iptables\n")
	if err := fs.Parse([]string{"--config=" + path}); err != nil {
		t.Fatal(err)
	}
	running, _, err := o.Complete(fs)
	if err != nil {
		t.Fatal(err)
	}
	bad := header + "mode: iptables\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n  NoSuchGate: true\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	next, _, reloadErr := o.Complete(fs)
	if reloadErr == nil || next != nil {
		t.Fatalf("reload with an unknown gate: config %v, error %v; want it refused", next, reloadErr)
	}
	_, _, startErr, _ := loadWith(t, "mode: iptables\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n  NoSuchGate: true\n")
	if startErr == nil {
		t.Fatal("a start with the same file loads")
	}
	want := path + `:6: featureGates.NoSuchGate: unknown feature gate "NoSuchGate"`
	if !strings.HasPrefix(reloadErr.Error(), want) {
		t.Errorf("reload error = %q, want it to start with %q", reloadErr, want)
	}
	// The start-time message names its own temporary file; otherwise it is the same.
	_, atReload, _ := strings.Cut(reloadErr.Error(), ":6:")
	_, atStart, _ := strings.Cut(startErr.Error(), ":6:")
	if atReload != atStart {
		t.Errorf("reload says %q, a start says %q", atReload, atStart)
	}
	if running.FeatureGates["NoSuchGate"] {
		t.Error("the running configuration changed")
	}
}

// TestFeatureEnabled checks the effective state of gates: explicit values, then AllAlpha/AllBeta for
// gates of their stage, then upstream's defaults.
func TestFeatureEnabled(t *testing.T) {
	tests := []struct {
		gates map[string]bool
		name  string
		want  bool
	}{
		{nil, "LoggingBetaOptions", true},
		{nil, "LoggingAlphaOptions", false},
		{nil, "KubeProxyIPVS", true},
		{nil, "NoSuchGate", false},
		{map[string]bool{"AllAlpha": true}, "KubeProxyNFTablesLocalhostNodePorts", true},
		{map[string]bool{"AllAlpha": true, "KubeProxyNFTablesLocalhostNodePorts": false}, "KubeProxyNFTablesLocalhostNodePorts", false},
		{map[string]bool{"AllAlpha": true}, "ContextualLogging", true},
		{map[string]bool{"AllBeta": false}, "ContextualLogging", false},
		{map[string]bool{"AllBeta": false}, "KubeProxyIPVS", true}, // deprecated, not beta
		{map[string]bool{"AllBeta": false}, "NFTablesProxyMode", true},
		{map[string]bool{"ContextualLogging": false}, "ContextualLogging", false},
	}
	for _, tt := range tests {
		c := &KubeProxyConfiguration{FeatureGates: tt.gates}
		if got := c.FeatureEnabled(tt.name); got != tt.want {
			t.Errorf("gates %v: FeatureEnabled(%s) = %v, want %v", tt.gates, tt.name, got, tt.want)
		}
	}
}

// TestUpstreamGateTable checks the table's consistency and a few of upstream v1.37.2's facts.
func TestUpstreamGateTable(t *testing.T) {
	for name, spec := range upstreamGates {
		for _, d := range spec.deps {
			if _, ok := upstreamGates[d]; !ok {
				t.Errorf("%s depends on unknown gate %s", name, d)
			}
		}
		if spec.def {
			for _, d := range spec.deps {
				if !upstreamGates[d].def {
					t.Errorf("%s is on by default but depends on %s, which is not", name, d)
				}
			}
		}
	}
	facts := map[string]gateSpec{
		"AllAlpha":                            {alpha, false, false, nil},
		"AllBeta":                             {beta, false, false, nil},
		"LoggingAlphaOptions":                 {alpha, false, false, nil},
		"LoggingBetaOptions":                  {beta, true, false, nil},
		"ContextualLogging":                   {beta, true, false, nil},
		"KubeProxyIPVS":                       {deprecated, true, false, nil},
		"KubeProxyNFTablesLocalhostNodePorts": {alpha, false, false, nil},
		"NFTablesProxyMode":                   {ga, true, true, nil},
		"MultiCIDRServiceAllocator":           {ga, true, true, nil},
		"AllowServiceExternalIPs":             {ga, true, false, nil},
	}
	for name, want := range facts {
		got, ok := upstreamGates[name]
		if !ok || got.stage != want.stage || got.def != want.def || got.locked != want.locked || len(got.deps) != 0 {
			t.Errorf("%s = %+v (known %v), want %+v", name, got, ok, want)
		}
	}
	if n := len(upstreamGates); n < 250 {
		t.Errorf("only %d gates; upstream v1.37.2 kube-proxy knows 254", n)
	}
}
