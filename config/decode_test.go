package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// cmpOpts compares quantities by value (their cached string form differs).
var cmpOpts = cmp.Options{
	cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 }),
}

// fieldErrors unpacks a joined error into its *FieldError parts.
func fieldErrors(t *testing.T, err error) []*FieldError {
	t.Helper()
	if err == nil {
		return nil
	}
	var parts []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	} else {
		parts = []error{err}
	}
	out := make([]*FieldError, 0, len(parts))
	for _, p := range parts {
		var fe *FieldError
		if !errors.As(p, &fe) {
			t.Fatalf("error %q is not a *FieldError", p)
		}
		out = append(out, fe)
	}
	return out
}

func TestDefaultsGolden(t *testing.T) {
	got, err := Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "defaults.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./config/ -run TestDefaultsGolden -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("Default() differs from %s (-want +got; -update to accept):\n%s", golden, diff)
	}
}

// TestDefaultValues pins the upstream defaults one by one, so that a golden
// file refreshed carelessly cannot hide a change.
func TestDefaultValues(t *testing.T) {
	c := Default()
	sync, minSync := c.SyncPeriods()
	checks := []struct {
		name      string
		got, want any
	}{
		{"apiVersion", c.APIVersion, "kubeproxy.config.k8s.io/v1alpha1"},
		{"kind", c.Kind, "KubeProxyConfiguration"},
		{"bindAddress", c.BindAddress, "0.0.0.0"},
		{"healthzBindAddress", c.HealthzBindAddress, "0.0.0.0:10256"},
		{"metricsBindAddress", c.MetricsBindAddress, "127.0.0.1:10249"},
		{"mode", c.Mode, ModeIPTables},
		{"detectLocalMode", c.DetectLocalMode, LocalModeClusterCIDR},
		{"clientConnection.contentType", c.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
		{"clientConnection.qps", c.ClientConnection.QPS, float32(5)},
		{"clientConnection.burst", c.ClientConnection.Burst, int32(10)},
		{"iptables.masqueradeBit", *c.IPTables.MasqueradeBit, int32(14)},
		{"iptables.localhostNodePorts", *c.IPTables.LocalhostNodePorts, true},
		{"iptables.syncPeriod", c.IPTables.SyncPeriod.Duration, 30 * time.Second},
		{"iptables.minSyncPeriod", c.IPTables.MinSyncPeriod.Duration, time.Second},
		{"ipvs.syncPeriod", c.IPVS.SyncPeriod.Duration, 30 * time.Second},
		{"ipvs.minSyncPeriod", c.IPVS.MinSyncPeriod.Duration, time.Duration(0)},
		{"ipvs.scheduler", c.IPVS.Scheduler, "rr"},
		{"nftables.masqueradeBit", *c.NFTables.MasqueradeBit, int32(14)},
		{"nftables.syncPeriod", c.NFTables.SyncPeriod.Duration, 30 * time.Second},
		{"nftables.minSyncPeriod", c.NFTables.MinSyncPeriod.Duration, time.Second},
		{"oomScoreAdj", *c.OOMScoreAdj, int32(-999)},
		{"conntrack.maxPerCore", *c.Conntrack.MaxPerCore, int32(32768)},
		{"conntrack.min", *c.Conntrack.Min, int32(131072)},
		{"conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout.Duration, 24 * time.Hour},
		{"conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout.Duration, time.Hour},
		{"conntrack.udpTimeout", c.Conntrack.UDPTimeout.Duration, time.Duration(0)},
		{"configSyncPeriod", c.ConfigSyncPeriod.Duration, 15 * time.Minute},
		{"logging.format", c.Logging.Format, "text"},
		{"logging.flushFrequency", c.Logging.FlushFrequency.Duration.Duration, 5 * time.Second},
		{"SyncPeriods() sync", sync, 30 * time.Second},
		{"SyncPeriods() min", minSync, time.Second},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Default() does not validate: %v", err)
	}
}

func TestDefaultsIPv6BindAddress(t *testing.T) {
	c := &KubeProxyConfiguration{BindAddress: "fd00::1"}
	SetDefaults(c)
	if c.HealthzBindAddress != "[::]:10256" || c.MetricsBindAddress != "[::1]:10249" {
		t.Errorf("got healthz %q metrics %q, want [::]:10256 and [::1]:10249", c.HealthzBindAddress, c.MetricsBindAddress)
	}
	c = &KubeProxyConfiguration{HealthzBindAddress: "10.0.0.1", MetricsBindAddress: "::"}
	SetDefaults(c)
	if c.HealthzBindAddress != "10.0.0.1:10256" || c.MetricsBindAddress != "[::]:10249" {
		t.Errorf("bare IPs: got healthz %q metrics %q, want 10.0.0.1:10256 and [::]:10249", c.HealthzBindAddress, c.MetricsBindAddress)
	}
}

// TestUpstreamConfigsLoad loads configs written for upstream kube-proxy,
// unchanged, and compares them with the defaults plus what they set.
func TestUpstreamConfigsLoad(t *testing.T) {
	tests := []struct {
		file string
		want func(c *KubeProxyConfiguration)
	}{{
		// kubeadm v1.37's kube-proxy ConfigMap "config.conf": every field is
		// written, most as "" / 0 / 0s / null, and all of them must default.
		file: "kubeadm-config.conf.yaml",
		want: func(c *KubeProxyConfiguration) {
			c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
			c.ClusterCIDR = "10.244.0.0/16"
		},
	}, {
		file: "hardway.yaml",
		want: func(c *KubeProxyConfiguration) {
			c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig"
			c.ClusterCIDR = "10.200.0.0/16"
		},
	}, {
		file: "apiserver-lab.yaml",
		want: func(c *KubeProxyConfiguration) {
			c.ClientConnection.Kubeconfig = "STATEDIR/kube-proxy-ns.kubeconfig"
			c.HostnameOverride = "node-a"
			c.ClusterCIDR = "10.244.0.0/16"
			c.HealthzBindAddress = "127.0.0.1:10256"
			// oomScoreAdj: null -> default -999.
			// iptables.minSyncPeriod: 0s -> 1s, as upstream (plain duration).
			// conntrack pointers set to 0 stay 0: leave the sysctls alone.
			c.Conntrack.MaxPerCore = ptr[int32](0)
			c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{}
			c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{}
		},
	}, {
		// Fields of older releases are ignored (TestRemovedFields checks the warnings).
		file: "kubeadm-v1.15-config.conf.yaml",
		want: func(c *KubeProxyConfiguration) {
			c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
			c.ClusterCIDR = "10.244.0.0/16"
			// Loaded (mode userspace reads it), with a warning since the mode is iptables.
			c.UDPIdleTimeout = metav1.Duration{Duration: 250 * time.Millisecond}
		},
	}, {
		file: "ipvs.yaml",
		want: func(c *KubeProxyConfiguration) {
			c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig"
			c.ClientConnection.QPS = 20
			c.ClientConnection.Burst = 40
			c.HostnameOverride = "worker-1"
			c.MetricsBindAddress = "0.0.0.0:10249"
			c.Mode = ModeIPVS
			c.IPVS = IPVSConfiguration{
				Scheduler:     "wlc",
				StrictARP:     true,
				SyncPeriod:    metav1.Duration{Duration: time.Minute},
				MinSyncPeriod: metav1.Duration{Duration: 5 * time.Second},
				ExcludeCIDRs:  []string{"10.96.100.0/24", "fd00:100::/64"},
				TCPTimeout:    metav1.Duration{Duration: 900 * time.Second},
				TCPFinTimeout: metav1.Duration{Duration: 120 * time.Second},
				UDPTimeout:    metav1.Duration{Duration: 300 * time.Second},
			}
			c.ClusterCIDR = "10.244.0.0/16,fd00:10:244::/56"
			c.NodePortAddresses = []string{"primary", "192.168.0.0/16"}
			c.Conntrack.MaxPerCore = ptr[int32](0)
			c.Conntrack.TCPBeLiberal = true
			c.FeatureGates = map[string]bool{"KubeProxyIPVS": true}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := Load(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			want := Default()
			tt.want(want)
			if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestKubeadmFlushFrequencyStaysNumeric(t *testing.T) {
	// kubeadm writes "flushFrequency: 0"; upstream then defaults it to 5s and
	// marks it as a string. Check the value, not just the flag.
	c, err := Load(filepath.Join("testdata", "kubeadm-config.conf.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Logging.FlushFrequency; got.Duration.Duration != 5*time.Second || !got.SerializeAsString {
		t.Errorf("flushFrequency = %+v, want 5s as a string", got)
	}
}

func TestSyncPeriodsFollowMode(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "ipvs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if s, m := c.SyncPeriods(); s != time.Minute || m != 5*time.Second {
		t.Errorf("ipvs SyncPeriods() = %v, %v; want 1m, 5s", s, m)
	}
	c.Mode = ModeNFTables
	c.NFTables.SyncPeriod.Duration = 7 * time.Second
	if s, _ := c.SyncPeriods(); s != 7*time.Second {
		t.Errorf("nftables SyncPeriods() = %v, want 7s", s)
	}
}

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// TestDecodeValues covers value semantics upstream has and a reimplementation
// could easily get wrong.
func TestDecodeValues(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		check func(t *testing.T, c *KubeProxyConfiguration)
	}{{
		name: "explicit minSyncPeriod 0s becomes 1s in iptables, stays 0 in ipvs",
		body: "iptables: {minSyncPeriod: 0s}\nipvs: {minSyncPeriod: 0s}\n",
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.IPTables.MinSyncPeriod.Duration != time.Second || c.IPVS.MinSyncPeriod.Duration != 0 {
				t.Errorf("iptables %v ipvs %v, want 1s and 0s", c.IPTables.MinSyncPeriod, c.IPVS.MinSyncPeriod)
			}
		},
	}, {
		name: "explicit zero pointers are kept",
		body: "oomScoreAdj: 0\niptables: {masqueradeBit: 0, localhostNodePorts: false}\nconntrack: {maxPerCore: 0, min: 0}\n",
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if *c.OOMScoreAdj != 0 || *c.IPTables.MasqueradeBit != 0 || *c.IPTables.LocalhostNodePorts || *c.Conntrack.MaxPerCore != 0 || *c.Conntrack.Min != 0 {
				t.Errorf("explicit zeros were defaulted: %+v %+v", c.IPTables, c.Conntrack)
			}
		},
	}, {
		name: "YAML 1.1 booleans, as upstream's YAML library reads them",
		body: "iptables: {masqueradeAll: yes}\nipvs: {strictARP: on}\nenableProfiling: True\n",
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if !c.IPTables.MasqueradeAll || !c.IPVS.StrictARP || !c.EnableProfiling {
				t.Errorf("got masqueradeAll=%v strictARP=%v enableProfiling=%v, want all true", c.IPTables.MasqueradeAll, c.IPVS.StrictARP, c.EnableProfiling)
			}
		},
	}, {
		name: "flushFrequency as nanoseconds",
		body: "logging: {flushFrequency: 2000000000, verbosity: 4, vmodule: [{filePattern: proxier, verbosity: 6}]}\n",
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			l := c.Logging
			if l.FlushFrequency.Duration.Duration != 2*time.Second || l.FlushFrequency.SerializeAsString || l.Verbosity != 4 || len(l.VModule) != 1 || l.VModule[0].Verbosity != 6 {
				t.Errorf("logging = %+v", l)
			}
		},
	}, {
		name: "JSON document",
		body: "", // replaced below
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.ClusterCIDR != "10.1.0.0/16" {
				t.Errorf("clusterCIDR = %q", c.ClusterCIDR)
			}
		},
	}, {
		name: "anchors, aliases and merge keys",
		body: "iptables: &p {syncPeriod: 10s, minSyncPeriod: 2s}\nnftables:\n  <<: *p\n  masqueradeAll: true\n",
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.NFTables.SyncPeriod.Duration != 10*time.Second || c.NFTables.MinSyncPeriod.Duration != 2*time.Second || !c.NFTables.MasqueradeAll {
				t.Errorf("nftables = %+v", c.NFTables)
			}
		},
	}, {
		name: "leading document marker and comments",
		body: "# comment\n",
		check: func(t *testing.T, c *KubeProxyConfiguration) {
			if c.Mode != ModeIPTables {
				t.Errorf("mode = %q", c.Mode)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := "---\n" + header + tt.body
			if tt.name == "JSON document" {
				data = `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "clusterCIDR": "10.1.0.0/16"}`
			}
			c, err := Decode("test.yaml", []byte(data))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			tt.check(t, c)
		})
	}
}

type wantErr struct {
	line  int
	field string
	msg   string // substring
}

func checkErrors(t *testing.T, err error, file string, want []wantErr) {
	t.Helper()
	got := fieldErrors(t, err)
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(got), len(want), err)
	}
	for i, w := range want {
		g := got[i]
		if g.File != file || g.Line != w.line || g.Field != w.field || !strings.Contains(g.Msg, w.msg) {
			t.Errorf("error %d = {File:%q Line:%d Field:%q Msg:%q}\n     want {File:%q Line:%d Field:%q Msg:~%q}",
				i, g.File, g.Line, g.Field, g.Msg, file, w.line, w.field, w.msg)
		}
	}
}

// TestRemovedFields: fields that older v1alpha1 releases had, which upstream
// v1.37 still loads and ignores, load with a warning naming the field and its
// line, whatever their value (upstream does not read it); a field that never
// existed, at that place, stays an error.
func TestRemovedFields(t *testing.T) {
	tests := []struct {
		name  string
		data  string // after the header
		warns []wantErr
		errs  []wantErr
	}{{
		name:  "udpIdleTimeout",
		data:  "udpIdleTimeout: 250ms\n",
		warns: []wantErr{{3, "udpIdleTimeout", "ignored: removed in v1.26 with the userspace proxy mode"}},
	}, {
		name:  "its v1.9 name, and a value that is no duration",
		data:  "udpTimeoutMilliseconds: 250\n",
		warns: []wantErr{{3, "udpTimeoutMilliseconds", "the v1.9 name of udpIdleTimeout"}},
	}, {
		name:  "resourceContainer",
		data:  "mode: iptables\nresourceContainer: /kube-proxy\n",
		warns: []wantErr{{4, "resourceContainer", "removed in v1.16"}},
	}, {
		name:  "conntrack.max beside the fields that replaced it",
		data:  "conntrack:\n  max: 0\n  maxPerCore: 0\n",
		warns: []wantErr{{4, "conntrack.max", "conntrack.maxPerCore"}},
	}, {
		name:  "portRange is still a field, and upstream reads nothing from it",
		data:  "portRange: 100-\n",
		warns: []wantErr{{3, "portRange", "ignored: it configured the userspace proxy mode"}},
	}, {
		name: "an empty portRange is quiet",
		data: "portRange: \"\"\n",
	}, {
		name:  "metadata, which kustomize adds",
		data:  "metadata:\n  name: kube-proxy\n",
		warns: []wantErr{{3, "metadata", "kustomize"}},
	}, {
		name: "a field that never existed is still an error, the removed ones are not",
		data: "udpIdleTimeout: 1s\nbogusField: 1\nresourceContainer: \"\"\n",
		errs: []wantErr{{4, "bogusField", "unknown field"}},
	}, {
		name: "a removed field at a place it never was",
		data: "iptables:\n  udpIdleTimeout: 1s\n",
		errs: []wantErr{{4, "iptables.udpIdleTimeout", "unknown field"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, warns, err := decodeFile("old.yaml", []byte(header+tt.data))
			if tt.errs != nil {
				if err == nil {
					t.Fatal("no error")
				}
				checkErrors(t, err, "old.yaml", tt.errs)
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if c == nil {
				t.Fatal("no config")
			}
			checkFieldErrors(t, "warning", warns, "old.yaml", tt.warns)
		})
	}

	// A whole ConfigMap of that era, through Complete as main loads it.
	path := filepath.Join("testdata", "kubeadm-v1.15-config.conf.yaml")
	o, fs := newFlagSet(t)
	if err := fs.Parse([]string{"--config=" + path}); err != nil {
		t.Fatal(err)
	}
	_, warns, err := o.Complete(fs)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	checkFieldErrors(t, "warning", warns, path, []wantErr{
		{14, "conntrack.max", "removed in v1.16"},
		{38, "resourceContainer", "removed in v1.16"},
		{39, "udpIdleTimeout", "removed in v1.26"},
	})
}

// TestLoggingOptionWarnings: output options that cannot act load, as upstream
// loads them, with a warning saying why they do nothing.
func TestLoggingOptionWarnings(t *testing.T) {
	gate := "featureGates: {LoggingAlphaOptions: true}\n"
	tests := []struct {
		data  string
		warns []wantErr
	}{
		{gate + "logging: {format: text, options: {text: {splitStream: true, infoBufferSize: 64Ki}}}\n", nil},
		{gate + "logging:\n  options:\n    json: {splitStream: true}\n", []wantErr{{6, "logging.options.json", "apply to log format json, and logging.format is text"}}},
		{gate + "logging:\n  options:\n    text: {infoBufferSize: 1Mi}\n", []wantErr{{6, "logging.options.text.infoBufferSize", "only with splitStream: true"}}},
	}
	for _, tt := range tests {
		_, warns, err := decodeFile("log.yaml", []byte(header+tt.data))
		if err != nil {
			t.Fatalf("%q: %v", tt.data, err)
		}
		checkFieldErrors(t, "warning", warns, "log.yaml", tt.warns)
	}
}

// TestDecodeErrors checks that every problem names the file, the field path
// and the line. Bodies start on line 3, after the header.
func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		data string // with header unless noHeader
		raw  bool
		want []wantErr
	}{
		{"unknown top-level field", "bindAdress: 1.2.3.4\n", false, []wantErr{{3, "bindAdress", "unknown field"}}},
		{"unknown nested field", "iptables:\n  syncPeriod: 30s\n  minSync: 1s\n", false, []wantErr{{5, "iptables.minSync", "unknown field"}}},
		{"case mismatch", "BindAddress: 1.2.3.4\n", false, []wantErr{{3, "BindAddress", `did you mean "bindAddress"`}}},
		{"field of another version", "syncPeriod: 10s\n", false, []wantErr{{3, "syncPeriod", "iptables.syncPeriod"}}},
		{"duplicate key", "mode: iptables\nclusterCIDR: 10.0.0.0/8\nmode: ipvs\n", false, []wantErr{{5, "mode", "first set on line 3"}}},
		{"duplicate nested key", "conntrack:\n  min: 1\n  min: 2\n", false, []wantErr{{5, "conntrack.min", "duplicate"}}},
		{"wrong type", "clientConnection:\n  qps: fast\n", false, []wantErr{{4, "clientConnection.qps", `got the string "fast", want a number`}}},
		{"bad duration", "iptables:\n  syncPeriod: 30x\n", false, []wantErr{{4, "iptables.syncPeriod", "want a duration"}}},
		{"duration without unit", "configSyncPeriod: 30\n", false, []wantErr{{3, "configSyncPeriod", "got the number 30, want a duration"}}},
		{"int out of range", "oomScoreAdj: 99999999999\n", false, []wantErr{{3, "oomScoreAdj", "32-bit"}}},
		{"mapping where list wanted", "nodePortAddresses: {a: b}\n", false, []wantErr{{3, "nodePortAddresses", "want a list"}}},
		{"scalar where mapping wanted", "iptables: fast\n", false, []wantErr{{3, "iptables", "want a mapping"}}},
		{"bad list element", "nodePortAddresses:\n  - 10.0.0.0/8\n  - [x]\n", false, []wantErr{{5, "nodePortAddresses[1]", "want a string"}}},
		{"several problems at once", "mod: ipvs\niptables: {syncPeriod: 1}\nfoo: 1\n", false, []wantErr{
			{3, "mod", "unknown field"}, {4, "iptables.syncPeriod", "want a duration"}, {5, "foo", "unknown field"}}},

		{"invalid mode", "mode: kernelspace-v2\n", false, []wantErr{{3, "mode", `unknown mode "kernelspace-v2"`}}},
		{"userspace runs (this project's extension)", "mode: userspace\n", false, nil},
		{"userspace reads udpIdleTimeout", "mode: userspace\nudpIdleTimeout: 1s\n", false, nil},
		{"udpIdleTimeout must not be negative", "mode: userspace\nudpIdleTimeout: -1s\n", false, []wantErr{{4, "udpIdleTimeout", "must not be negative"}}},
		{"nftables runs", "mode: nftables\n", false, nil},
		{"kernelspace not implemented", "mode: kernelspace\n", false, []wantErr{{3, "mode", "does not implement; use iptables or ipvs or nftables"}}},
		{"nftables checks its own section", "mode: nftables\nnftables:\n  masqueradeBit: 40\n", false, []wantErr{{5, "nftables.masqueradeBit", "[0, 31]"}}},
		{"bad masqueradeBit", "iptables:\n  masqueradeBit: 32\n", false, []wantErr{{4, "iptables.masqueradeBit", "[0, 31]"}}},
		{"minSyncPeriod > syncPeriod", "iptables:\n  syncPeriod: 10s\n  minSyncPeriod: 20s\n", false, []wantErr{{5, "iptables.minSyncPeriod", "must not be greater than iptables.syncPeriod"}}},
		{"syncPeriod below defaulted min: points at syncPeriod", "iptables:\n  syncPeriod: 500ms\n", false, []wantErr{{4, "iptables.minSyncPeriod", "must not be greater"}}},
		{"negative sync period", "iptables:\n  syncPeriod: -1s\n", false, []wantErr{{4, "iptables.syncPeriod", "greater than 0"}}},
		{"ipvs checks in ipvs mode", "mode: ipvs\nipvs:\n  scheduler: fastest\n  excludeCIDRs: [10.0.0.0/8, 10.0.0.0]\n  tcpTimeout: -5s\n", false, []wantErr{
			{5, "ipvs.scheduler", `unknown IPVS scheduler "fastest"`}, {6, "ipvs.excludeCIDRs[1]", "not a CIDR"}, {7, "ipvs.tcpTimeout", "must not be negative"}}},
		{"ipvs leftovers ignored in iptables mode", "ipvs:\n  scheduler: fastest\n  tcpTimeout: -5s\n", false, nil},
		{"ipvs gate off", "mode: ipvs\nfeatureGates:\n  KubeProxyIPVS: false\n", false, []wantErr{{3, "mode", "KubeProxyIPVS"}}},
		{"bad clusterCIDR", "clusterCIDR: 10.0.0.0/33\n", false, []wantErr{{3, "clusterCIDR", "not a CIDR"}}},
		{"clusterCIDR pair not dual-stack", "clusterCIDR: 10.0.0.0/8,192.168.0.0/16\n", false, []wantErr{{3, "clusterCIDR", "dual-stack"}}},
		{"bad nodePortAddresses", "nodePortAddresses:\n  - primary\n  - 10.0.0.1\n  - primary\n", false, []wantErr{
			{5, "nodePortAddresses[1]", "primary"}, {6, "nodePortAddresses[2]", "listed twice"}}},
		{"bad bind addresses", "bindAddress: 1.2.3\nhealthzBindAddress: 0.0.0.0:0\nmetricsBindAddress: localhost:10249\n", false, []wantErr{
			{3, "bindAddress", "not an IP"}, {4, "healthzBindAddress", "1..65535"}, {5, "metricsBindAddress", "not an IP"}}},
		{"unknown detectLocalMode", "detectLocalMode: PodCIDR\n", false, []wantErr{{3, "detectLocalMode", "unknown mode"}}},
		{"BridgeInterface without bridge: line of detectLocalMode", "detectLocalMode: BridgeInterface\n", false, []wantErr{{3, "detectLocal.bridgeInterface", "must be set"}}},
		{"InterfaceNamePrefix with empty prefix", "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: \"\"\n", false, []wantErr{{5, "detectLocal.interfaceNamePrefix", "must be set"}}},
		{"conntrack negatives", "conntrack:\n  maxPerCore: -1\n  min: -2\n  udpTimeout: -1s\n", false, []wantErr{
			{4, "conntrack.maxPerCore", "negative"}, {5, "conntrack.min", "negative"}, {6, "conntrack.udpTimeout", "negative"}}},
		{"oomScoreAdj range", "oomScoreAdj: 1001\n", false, []wantErr{{3, "oomScoreAdj", "[-1000, 1000]"}}},
		{"logging", "logging:\n  format: xml\n  vmodule:\n    - filePattern: a=b\n      verbosity: 2\n", false, []wantErr{
			{4, "logging.format", `unsupported log format "xml"`}, {5, "logging.vmodule", "only supported with the text"}, {6, "logging.vmodule[0].filePattern", "must not contain"}}},
		{"alpha logging options need the gate", "logging:\n  options:\n    text:\n      splitStream: true\n", false, []wantErr{{6, "logging.options.text.splitStream", "LoggingAlphaOptions"}}},
		{"client negatives", "clientConnection:\n  qps: -1\n  burst: -1\n", false, []wantErr{{4, "clientConnection.qps", "negative"}, {5, "clientConnection.burst", "negative"}}},
		{"showHiddenMetricsForVersion", "showHiddenMetricsForVersion: \"1.30\"\n", false, []wantErr{{3, "showHiddenMetricsForVersion", `"1.36"`}}},

		{"empty file", "", true, []wantErr{{0, "", "empty"}}},
		{"comments only", "# nothing\n", true, []wantErr{{0, "", "must at least set apiVersion"}}},
		{"missing apiVersion and kind", "mode: iptables\n", true, []wantErr{
			{0, "apiVersion", "missing; want apiVersion: kubeproxy.config.k8s.io/v1alpha1 with kind: KubeProxyConfiguration"},
			{0, "kind", "missing"}}},
		{"wrong apiVersion", "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n", true, []wantErr{
			{1, "apiVersion", `the string "kubeproxy.config.k8s.io/v1alpha2" is not supported; want apiVersion: kubeproxy.config.k8s.io/v1alpha1 with kind: KubeProxyConfiguration`}}},
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", true, []wantErr{{2, "kind", "not supported"}}},
		{"not a mapping", "- a\n- b\n", true, []wantErr{{1, "", "top level must be a mapping"}}},
		{"syntax error", header + "mode: iptables\n  bad: indent\n", true, []wantErr{{4, "", "invalid YAML"}}},
		{"tab indentation", header + "iptables:\n\tsyncPeriod: 1s\n", true, []wantErr{{4, "", "invalid YAML"}}},
		{"two documents", header + "---\n" + header, true, []wantErr{{3, "", "second YAML document"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := tt.data
			if !tt.raw {
				data = header + data
			}
			_, err := Decode("test.yaml", []byte(data))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			checkErrors(t, err, "test.yaml", tt.want)
		})
	}
}

func TestFieldErrorFormat(t *testing.T) {
	tests := []struct {
		e    FieldError
		want string
	}{
		{FieldError{"f.yaml", 3, "iptables.syncPeriod", "bad"}, "f.yaml:3: iptables.syncPeriod: bad"},
		{FieldError{"f.yaml", 0, "mode", "bad"}, "f.yaml: mode: bad"},
		{FieldError{"", 0, "mode", "bad"}, "mode: bad"},
		{FieldError{"", 7, "", "bad"}, "line 7: bad"},
		{FieldError{"f.yaml", 2, "", "bad"}, "f.yaml:2: bad"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want a wrapped os.ErrNotExist", err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, file := range []string{"kubeadm-config.conf.yaml", "hardway.yaml", "apiserver-lab.yaml", "ipvs.yaml"} {
		t.Run(file, func(t *testing.T) {
			c, err := Load(filepath.Join("testdata", file))
			if err != nil {
				t.Fatal(err)
			}
			out, err := Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Decode("marshaled.yaml", out)
			if err != nil {
				t.Fatalf("decoding Marshal output: %v\n%s", err, out)
			}
			if diff := cmp.Diff(c, back, cmpOpts); diff != "" {
				t.Errorf("round trip changed the config (-before +after):\n%s", diff)
			}
		})
	}
}

func TestDeepCopy(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "ipvs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d := c.DeepCopy()
	if diff := cmp.Diff(c, d, cmpOpts); diff != "" {
		t.Fatalf("copy differs:\n%s", diff)
	}
	*d.OOMScoreAdj = 5
	d.IPVS.ExcludeCIDRs[0] = "changed"
	d.FeatureGates["X"] = true
	d.Logging.Options.Text.InfoBufferSize.Add(resource.MustParse("1Ki"))
	if *c.OOMScoreAdj == 5 || c.IPVS.ExcludeCIDRs[0] == "changed" || c.FeatureGates["X"] || c.Logging.Options.Text.InfoBufferSize.Value() != 0 {
		t.Error("DeepCopy shares memory with the original")
	}
}
