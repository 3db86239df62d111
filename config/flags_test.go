package config

import (
	goflag "flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// newFlagSet builds the flag set the way main does: our flags plus klog's
// (--v, --vmodule, ...) from a Go flag set.
func newFlagSet(t *testing.T) (*Options, *pflag.FlagSet) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	o.AddFlags(fs)
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	fs.AddGoFlagSet(gfs)
	return o, fs
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kube-proxy-config.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFlagOverrides(t *testing.T) {
	file := header + `clientConnection: {kubeconfig: /from/file}
hostnameOverride: file-node
mode: iptables
iptables: {syncPeriod: 20s, minSyncPeriod: 2s}
featureGates: {KubeProxyNFTablesLocalhostNodePorts: true, ContextualLogging: true}
nodePortAddresses: [primary]
logging: {vmodule: [{filePattern: file, verbosity: 1}]}
`
	tests := []struct {
		name      string
		file      string // "" runs without --config
		args      []string
		check     func(t *testing.T, c *KubeProxyConfiguration)
		overrides []string
	}{{
		name: "no flags: the file as is",
		file: file,
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.HostnameOverride != "file-node" || c.ClientConnection.Kubeconfig != "/from/file" {
				t.Errorf("got %q %q", c.HostnameOverride, c.ClientConnection.Kubeconfig)
			}
		},
	}, {
		name: "flags win over the file",
		file: file,
		args: []string{"--hostname-override= Node-B ", "--kubeconfig=/from/flag", "--iptables-sync-period=45s",
			"--feature-gates=ContextualLogging=false,LoggingAlphaOptions=true", "--nodeport-addresses=10.0.0.0/8,localhost", "--masquerade-all",
			"--healthz-bind-address=127.0.0.1", "--metrics-bind-address=[::1]:9999", "--conntrack-max-per-core=0"},
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.HostnameOverride != "node-b" {
				t.Errorf("hostnameOverride = %q, want trimmed and lower-cased node-b", c.HostnameOverride)
			}
			if c.ClientConnection.Kubeconfig != "/from/flag" {
				t.Errorf("kubeconfig = %q", c.ClientConnection.Kubeconfig)
			}
			if c.IPTables.SyncPeriod.Duration != 45*time.Second || c.IPTables.MinSyncPeriod.Duration != 2*time.Second {
				t.Errorf("iptables periods = %v %v, want 45s 2s", c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod)
			}
			if diff := cmp.Diff(map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true, "ContextualLogging": false, "LoggingAlphaOptions": true}, c.FeatureGates); diff != "" {
				t.Errorf("featureGates (-want +got):\n%s", diff)
			}
			if !slices.Equal(c.NodePortAddresses, []string{"10.0.0.0/8", "localhost"}) || !c.IPTables.MasqueradeAll {
				t.Errorf("nodePortAddresses %v masqueradeAll %v", c.NodePortAddresses, c.IPTables.MasqueradeAll)
			}
			if c.HealthzBindAddress != "127.0.0.1:10256" || c.MetricsBindAddress != "[::1]:9999" {
				t.Errorf("healthz %q metrics %q", c.HealthzBindAddress, c.MetricsBindAddress)
			}
			if *c.Conntrack.MaxPerCore != 0 {
				t.Errorf("conntrack.maxPerCore = %d, want 0", *c.Conntrack.MaxPerCore)
			}
		},
		overrides: []string{"featureGates", "clientConnection.kubeconfig", "hostnameOverride", "healthzBindAddress",
			"metricsBindAddress", "iptables.masqueradeAll", "iptables.syncPeriod", "nodePortAddresses", "conntrack.maxPerCore"},
	}, {
		name: "klog's -v and --vmodule fill logging",
		file: file,
		args: []string{"-v=4", "--vmodule=proxier=6"},
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			want := VModuleConfiguration{{FilePattern: "proxier", Verbosity: 6}, {FilePattern: "file", Verbosity: 1}}
			if c.Logging.Verbosity != 4 || !slices.Equal(c.Logging.VModule, want) {
				t.Errorf("logging = %+v", c.Logging)
			}
		},
		overrides: []string{"logging.verbosity", "logging.vmodule"},
	}, {
		name: "an explicit zero min sync period is kept",
		file: file,
		args: []string{"--iptables-min-sync-period=0"},
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if _, m := c.SyncPeriods(); m != 0 {
				t.Errorf("minSyncPeriod = %v, want 0", m)
			}
		},
		overrides: []string{"iptables.minSyncPeriod"},
	}, {
		name: "empty hostname-override is ignored, as upstream",
		file: file,
		args: []string{"--hostname-override="},
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.HostnameOverride != "file-node" {
				t.Errorf("hostnameOverride = %q", c.HostnameOverride)
			}
		},
	}, {
		name: "without --config: defaults plus flags",
		args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=lc", "--ipvs-min-sync-period=3s", "--cluster-cidr=10.1.0.0/16,fd00::/64",
			"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth", "--log-flush-frequency=2s",
			"--conntrack-tcp-timeout-close-wait=0s", "--oom-score-adj=-500"},
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			want := Default()
			want.Mode = ModeIPVS
			want.IPVS.Scheduler = "lc"
			want.IPVS.MinSyncPeriod.Duration = 3 * time.Second
			want.ClusterCIDR = "10.1.0.0/16,fd00::/64"
			want.DetectLocalMode = LocalModeInterfaceNamePrefix
			want.DetectLocal.InterfaceNamePrefix = "veth"
			want.Logging.FlushFrequency.Duration.Duration = 2 * time.Second
			want.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{}
			want.OOMScoreAdj = ptr[int32](-500)
			if diff := cmp.Diff(want, c, cmpOpts); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		},
		overrides: []string{"logging.flushFrequency", "mode", "ipvs.minSyncPeriod", "ipvs.scheduler", "detectLocalMode",
			"detectLocal.interfaceNamePrefix", "clusterCIDR", "oomScoreAdj", "conntrack.tcpCloseWaitTimeout"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, fs := newFlagSet(t)
			args := tt.args
			if tt.file != "" {
				args = append([]string{"--config=" + writeFile(t, tt.file)}, args...)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			c, _, err := o.Complete(fs)
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			tt.check(t, c)
			if diff := cmp.Diff(tt.overrides, o.Overrides(fs)); diff != "" {
				t.Errorf("Overrides (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		name     string
		file     string
		args     []string
		parseErr string // substring of the fs.Parse error
		want     []wantErr
		wantFile bool // errors carry the config file name
	}{
		{name: "unsupported --windows-service", args: []string{"--windows-service"}, parseErr: "Windows-only"},
		{name: "a deprecated port flag takes a number", args: []string{"--metrics-port=http"}, parseErr: "invalid argument"},
		{name: "port 0 empties the metrics address, which upstream's validation refuses too", args: []string{"--metrics-port=0"},
			want: []wantErr{{0, "metricsBindAddress", `"" must be ip:port (IPv6 as [ip]:port) (set by --metrics-port)`}}},
		{name: "a port out of range from a deprecated flag names the flag",
			args: []string{"--healthz-bind-address=127.0.0.1", "--healthz-port=70000"},
			want: []wantErr{{0, "healthzBindAddress", "(set by --healthz-port)"}}},
		{name: "bad feature gate syntax", args: []string{"--feature-gates=A=maybe"}, parseErr: "not true or false"},
		{name: "bad bit from a flag names the flag", args: []string{"--iptables-masquerade-bit=40"},
			want: []wantErr{{0, "iptables.masqueradeBit", "(set by --iptables-masquerade-bit)"}}},
		{name: "kernelspace from a flag", args: []string{"--proxy-mode=kernelspace"},
			want: []wantErr{{0, "mode", "does not implement; use iptables or ipvs or nftables or userspace (set by --proxy-mode)"}}},
		{name: "a flush frequency of 0, as upstream", args: []string{"--log-flush-frequency=0"},
			want: []wantErr{{0, "logging.flushFrequency", "must be greater than 0 (set by --log-flush-frequency)"}}},
		{name: "blank hostname", args: []string{"--hostname-override=   "},
			want: []wantErr{{0, "hostnameOverride", "must not be blank (set by --hostname-override)"}}},
		{name: "bad list element from a flag", args: []string{"--nodeport-addresses=primary,10.0.0.1"},
			want: []wantErr{{0, "nodePortAddresses[1]", "(set by --nodeport-addresses)"}}},
		{name: "file errors keep file and line, flag errors do not",
			file: header + "oomScoreAdj: 5000\n", args: []string{"--conntrack-min=-1"},
			want: []wantErr{{3, "oomScoreAdj", "[-1000, 1000]"}, {0, "conntrack.min", "(set by --conntrack-min)"}}, wantFile: true},
		{name: "strict decoding errors are returned before flags apply",
			file: header + "oomScoreAdj: 5000\nbogus: 1\n", args: []string{"--oom-score-adj=1"},
			want: []wantErr{{4, "bogus", "unknown field"}}, wantFile: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, fs := newFlagSet(t)
			args := tt.args
			var path string
			if tt.file != "" {
				path = writeFile(t, tt.file)
				args = append([]string{"--config=" + path}, args...)
			}
			err := fs.Parse(args)
			if tt.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.parseErr) {
					t.Fatalf("Parse error = %v, want it to contain %q", err, tt.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			_, _, err = o.Complete(fs)
			if err == nil {
				t.Fatal("Complete: no error")
			}
			got := fieldErrors(t, err)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors, want %d: %v", len(got), len(tt.want), err)
			}
			for i, w := range tt.want {
				g := got[i]
				wantFile := ""
				if tt.wantFile && !strings.Contains(g.Msg, "(set by --") {
					wantFile = path
				}
				if g.File != wantFile || g.Line != w.line || g.Field != w.field || !strings.Contains(g.Msg, w.msg) {
					t.Errorf("error %d = %+v, want file %q line %d field %q msg ~%q", i, *g, wantFile, w.line, w.field, w.msg)
				}
			}
		})
	}
}

// TestFlagTable keeps the flag table, the registered flags and the struct in
// step: every table entry is a flag (klog's --v/--vmodule come from main) and
// names a real field, and every registered flag is accounted for.
func TestFlagTable(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	known := map[string]bool{"config": true, "write-config-to": true, "cleanup": true, "init-only": true, "version": true, "master": true}
	for _, u := range unsupportedFlags {
		known[u.flag] = true
	}
	for _, p := range portFlags {
		known[p.flag] = true
		if fs.Lookup(p.addrFlag) == nil || !slices.ContainsFunc(fieldFlags, func(ff fieldFlag) bool { return ff.flag == p.addrFlag && ff.field == p.field }) {
			t.Errorf("--%s completes --%s, which does not set %s", p.flag, p.addrFlag, p.field)
		}
	}
	paths := map[string]bool{}
	for _, p := range leafPaths() {
		paths[p] = true
	}
	for _, ff := range fieldFlags {
		known[ff.flag] = true
		if ff.flag == "v" || ff.flag == "vmodule" {
			if fs.Lookup(ff.flag) != nil {
				t.Errorf("--%s must be left to klog", ff.flag)
			}
		} else if fs.Lookup(ff.flag) == nil {
			t.Errorf("--%s is in the table but not registered", ff.flag)
		}
		if !paths[ff.field] {
			t.Errorf("--%s maps to %q, which is not a field", ff.flag, ff.field)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !known[f.Name] {
			t.Errorf("--%s is registered but neither in the table nor a command flag", f.Name)
		}
	})
}

// TestWriteConfigRoundTrip is what --write-config-to does: the effective
// config, marshaled, must load back to the same config.
func TestWriteConfigRoundTrip(t *testing.T) {
	o, fs := newFlagSet(t)
	out := filepath.Join(t.TempDir(), "written.yaml")
	args := []string{"--config=" + filepath.Join("testdata", "ipvs.yaml"), "--write-config-to=" + out,
		"--ipvs-min-sync-period=0", "--feature-gates=LoggingAlphaOptions=true", "--log-text-split-stream", "--log-text-info-buffer-size=64Ki", "-v=3"}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	c, _, err := o.Complete(fs)
	if err != nil {
		t.Fatal(err)
	}
	if o.WriteConfigTo != out {
		t.Fatalf("WriteConfigTo = %q", o.WriteConfigTo)
	}
	b, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := Load(out)
	if err != nil {
		t.Fatalf("loading written config: %v\n%s", err, b)
	}
	if diff := cmp.Diff(c, back, cmpOpts); diff != "" {
		t.Errorf("written config loads differently (-written +loaded):\n%s", diff)
	}
	if back.IPVS.MinSyncPeriod.Duration != 0 || back.Logging.Options.Text.InfoBufferSize.Value() != 64*1024 || back.Logging.Verbosity != 3 {
		t.Errorf("flag values lost: %+v %+v", back.IPVS, back.Logging)
	}
}

// TestCompleteRepeatable: main calls Complete again on SIGHUP; the second
// call must see the file's new content and the same flags.
func TestCompleteRepeatable(t *testing.T) {
	o, fs := newFlagSet(t)
	path := writeFile(t, header+"iptables: {syncPeriod: 10s}\n")
	if err := fs.Parse([]string{"--config=" + path, "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true", "--hostname-override=n1"}); err != nil {
		t.Fatal(err)
	}
	first, _, err := o.Complete(fs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(header+"iptables: {syncPeriod: 20s}\nfeatureGates: {LoggingAlphaOptions: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	second, _, err := o.Complete(fs)
	if err != nil {
		t.Fatal(err)
	}
	if first.IPTables.SyncPeriod.Duration != 10*time.Second || second.IPTables.SyncPeriod.Duration != 20*time.Second {
		t.Errorf("sync periods %v then %v, want 10s then 20s", first.IPTables.SyncPeriod, second.IPTables.SyncPeriod)
	}
	if diff := cmp.Diff(map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true, "LoggingAlphaOptions": true}, second.FeatureGates); diff != "" || second.HostnameOverride != "n1" {
		t.Errorf("second load: gates (-want +got) %s, hostname %q", diff, second.HostnameOverride)
	}
	if _, ok := first.FeatureGates["LoggingAlphaOptions"]; ok {
		t.Error("the first config was changed by the second Complete")
	}
	live, restart := ReloadPlan(first, second)
	if !slices.Equal(live, []string{"iptables.syncPeriod"}) || !slices.Equal(restart, []string{"featureGates"}) {
		t.Errorf("ReloadPlan = %v, %v", live, restart)
	}
}

// TestNFTablesNodePortDefault checks upstream's platform default: in mode nftables an empty
// nodePortAddresses means "primary", whether the mode comes from the file or a flag; other modes and an
// explicit list keep what was given.
func TestNFTablesNodePortDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		args []string
		want []string
	}{
		{"file", header + "mode: nftables\n", nil, []string{"primary"}},
		{"flag", header, []string{"--proxy-mode=nftables"}, []string{"primary"}},
		{"explicit list", header + "mode: nftables\nnodePortAddresses: [10.0.0.0/8]\n", nil, []string{"10.0.0.0/8"}},
		{"iptables", header, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, fs := newFlagSet(t)
			if err := fs.Parse(append([]string{"--config=" + writeFile(t, tc.file)}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			c, _, err := o.Complete(fs)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, c.NodePortAddresses); diff != "" {
				t.Errorf("nodePortAddresses (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNFTablesTakesIPTablesFlags checks that, as upstream's, --iptables-min-sync-period,
// --iptables-sync-period and --masquerade-all apply to mode nftables, and only to its section there.
func TestNFTablesTakesIPTablesFlags(t *testing.T) {
	o, fs := newFlagSet(t)
	if err := fs.Parse([]string{"--config=" + writeFile(t, header+"mode: nftables\n"), "--iptables-min-sync-period=0", "--iptables-sync-period=7s", "--masquerade-all"}); err != nil {
		t.Fatal(err)
	}
	c, _, err := o.Complete(fs)
	if err != nil {
		t.Fatal(err)
	}
	sync, minSync := c.SyncPeriods()
	if sync != 7*time.Second || minSync != 0 || !c.NFTables.MasqueradeAll {
		t.Errorf("nftables sync %v min %v masqueradeAll %v; want 7s, 0s, true", sync, minSync, c.NFTables.MasqueradeAll)
	}
	o, fs = newFlagSet(t)
	if err := fs.Parse([]string{"--config=" + writeFile(t, header), "--masquerade-all"}); err != nil {
		t.Fatal(err)
	}
	if c, _, err = o.Complete(fs); err != nil || c.NFTables.MasqueradeAll {
		t.Errorf("mode iptables: nftables.masqueradeAll = %v (err %v), want false", c.NFTables.MasqueradeAll, err)
	}
}

// TestDeprecatedPortFlags: upstream's --healthz-port and --metrics-port are accepted as upstream accepts
// them: 0 turns the server off, another port completes a bare IP from the address flag, and an address
// with a port of its own keeps it (with a warning here, silently upstream). pflag prints the deprecation.
func TestDeprecatedPortFlags(t *testing.T) {
	tests := []struct {
		name             string
		file             string
		args             []string
		healthz, metrics string
		warning          string // substring of the only warning; "" for none
		overrides        []string
	}{{
		name: "port 0 turns the health server off", args: []string{"--healthz-port=0"},
		healthz: "", metrics: "127.0.0.1:10249", overrides: []string{"healthzBindAddress"},
	}, {
		name: "a port completes a bare IPv4", args: []string{"--healthz-bind-address=127.0.0.2", "--healthz-port=12345"},
		healthz: "127.0.0.2:12345", metrics: "127.0.0.1:10249", overrides: []string{"healthzBindAddress"},
	}, {
		name: "a port completes a bare IPv6", args: []string{"--metrics-port=9999", "--metrics-bind-address=::1"},
		healthz: "0.0.0.0:10256", metrics: "[::1]:9999", overrides: []string{"metricsBindAddress"},
	}, {
		name: "alone, a port changes nothing, as upstream", args: []string{"--healthz-port=12345"},
		healthz: "0.0.0.0:10256", metrics: "127.0.0.1:10249",
		warning: `healthzBindAddress: --healthz-port=12345 changes nothing, as upstream: the address "0.0.0.0:10256" has a port of its own; use --healthz-bind-address=0.0.0.0:12345`,
	}, {
		name: "an address with a port keeps it", args: []string{"--metrics-bind-address=127.0.0.2:7777", "--metrics-port=12345"},
		healthz: "0.0.0.0:10256", metrics: "127.0.0.2:7777", overrides: []string{"metricsBindAddress"},
		warning: "use --metrics-bind-address=127.0.0.2:12345",
	}, {
		name: "with --config, the flag wins over the file as every flag does", file: header + "healthzBindAddress: 10.0.0.1:1000\n",
		args: []string{"--healthz-port=0"}, healthz: "", metrics: "127.0.0.1:10249", overrides: []string{"healthzBindAddress"},
	}, {
		name: "a bare IP without the port flag gets the default port", args: []string{"--healthz-bind-address=127.0.0.2"},
		healthz: "127.0.0.2:10256", metrics: "127.0.0.1:10249", overrides: []string{"healthzBindAddress"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, fs := newFlagSet(t)
			out := new(strings.Builder)
			fs.SetOutput(out)
			args := tt.args
			if tt.file != "" {
				args = append([]string{"--config=" + writeFile(t, tt.file)}, args...)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			c, warns, err := o.Complete(fs)
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if c.HealthzBindAddress != tt.healthz || c.MetricsBindAddress != tt.metrics {
				t.Errorf("addresses %q, %q; want %q, %q", c.HealthzBindAddress, c.MetricsBindAddress, tt.healthz, tt.metrics)
			}
			switch {
			case tt.warning == "" && len(warns) > 0:
				t.Errorf("unexpected warnings: %v", warns)
			case tt.warning != "" && (len(warns) != 1 || !strings.Contains(warns[0].Error(), tt.warning)):
				t.Errorf("warnings %v, want one containing %q", warns, tt.warning)
			}
			if diff := cmp.Diff(tt.overrides, o.Overrides(fs)); diff != "" {
				t.Errorf("Overrides (-want +got):\n%s", diff)
			}
			for _, p := range portFlags {
				used := slices.ContainsFunc(tt.args, func(a string) bool { return strings.HasPrefix(a, "--"+p.flag+"=") })
				if got := strings.Contains(out.String(), "Flag --"+p.flag+" has been deprecated"); got != used {
					t.Errorf("deprecation notice for --%s printed: %v, want %v (output %q)", p.flag, got, used, out.String())
				}
			}
		})
	}
}

// TestFlagHelp: the help of --proxy-mode names every mode, that of --cleanup every kind of rule it removes,
// and the deprecated port flags stay out of the help, as upstream's.
func TestFlagHelp(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	mode := fs.Lookup("proxy-mode").Usage
	for _, m := range supportedModes {
		if !strings.Contains(mode, string(m)) {
			t.Errorf("--proxy-mode help %q does not name mode %s", mode, m)
		}
	}
	if !strings.Contains(mode, "iptables (the default)") {
		t.Errorf("--proxy-mode help %q does not say which mode is the default", mode)
	}
	cleanup := fs.Lookup("cleanup").Usage
	for _, w := range []string{"iptables", "nftables", "IPVS"} {
		if !strings.Contains(cleanup, w) {
			t.Errorf("--cleanup help %q does not name %s", cleanup, w)
		}
	}
	usage := fs.FlagUsages()
	for _, p := range portFlags {
		if strings.Contains(usage, "--"+p.flag) {
			t.Errorf("deprecated --%s is listed in the help", p.flag)
		}
	}
}

// TestModeDefaulted: the mode counts as defaulted, as upstream's warning has it, when neither the file nor
// --proxy-mode names one; the flag decides when it is given.
func TestModeDefaulted(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string // "" runs without --config
		args []string
		want bool
	}{
		{name: "no file, no flag", want: true},
		{name: "the flag", args: []string{"--proxy-mode=iptables"}, want: false},
		{name: "an empty flag", args: []string{"--proxy-mode="}, want: true},
		{name: "a file without mode", file: header, want: true},
		{name: "a file with an empty mode", file: header + "mode: \"\"\n", want: true},
		{name: "a file naming iptables", file: header + "mode: iptables\n", want: false},
		{name: "a file naming nftables", file: header + "mode: nftables\n", want: false},
		{name: "an empty flag over a file's mode", file: header + "mode: ipvs\n", args: []string{"--proxy-mode="}, want: true},
		{name: "the flag over a file without mode", file: header, args: []string{"--proxy-mode=ipvs"}, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, fs := newFlagSet(t)
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config=" + writeFile(t, tc.file)}, args...)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			c, _, err := o.Complete(fs)
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if got := o.ModeDefaulted(fs); got != tc.want {
				t.Errorf("ModeDefaulted = %v, want %v", got, tc.want)
			}
			if tc.want && c.Mode != ModeIPTables {
				t.Errorf("a defaulted mode is %q, want iptables", c.Mode)
			}
		})
	}
}
