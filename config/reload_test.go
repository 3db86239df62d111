package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestReloadPlan(t *testing.T) {
	tests := []struct {
		name          string
		change        func(c *KubeProxyConfiguration)
		live, restart []string
	}{
		{"nothing", func(*KubeProxyConfiguration) {}, nil, nil},
		{"sync periods", func(c *KubeProxyConfiguration) {
			c.IPTables.SyncPeriod.Duration = time.Minute
			c.IPTables.MinSyncPeriod.Duration = 0
			c.IPVS.SyncPeriod.Duration = time.Minute
		}, []string{"iptables.syncPeriod", "iptables.minSyncPeriod", "ipvs.syncPeriod"}, nil},
		{"verbosity and vmodule", func(c *KubeProxyConfiguration) {
			c.Logging.Verbosity = 5
			c.Logging.VModule = VModuleConfiguration{{FilePattern: "x", Verbosity: 2}}
		}, []string{"logging.verbosity", "logging.vmodule"}, nil},
		{"logging: what systemd.Logging.Apply puts in force is live, the format and streams need a restart", func(c *KubeProxyConfiguration) {
			c.Logging.FlushFrequency.Duration.Duration = time.Second
			c.Logging.Format = "json"
			c.Logging.Options.JSON.SplitStream = true
			c.Logging.Options.Text.InfoBufferSize = resource.QuantityValue{Quantity: resource.MustParse("64Ki")}
		}, []string{"logging.flushFrequency"}, []string{"logging.format", "logging.options.text.infoBufferSize", "logging.options.json.splitStream"}},
		{"dataplane re-render", func(c *KubeProxyConfiguration) {
			c.IPTables.MasqueradeAll = true
			*c.IPTables.MasqueradeBit = 15
			c.IPVS.Scheduler = "wlc"
			c.IPVS.ExcludeCIDRs = []string{"10.0.0.0/8"}
			c.ClusterCIDR = "10.0.0.0/8"
			c.DetectLocalMode = LocalModeNodeCIDR
			c.DetectLocal.BridgeInterface = "cbr0"
			c.NodePortAddresses = []string{"primary"}
		}, []string{"iptables.masqueradeBit", "iptables.masqueradeAll", "ipvs.scheduler", "ipvs.excludeCIDRs",
			"detectLocalMode", "detectLocal.bridgeInterface", "clusterCIDR", "nodePortAddresses"}, nil},
		{"restart fields", func(c *KubeProxyConfiguration) {
			c.Mode = ModeIPVS
			c.HostnameOverride = "other"
			c.ClientConnection.Kubeconfig = "/k"
			c.ClientConnection.QPS = 50
			c.BindAddress = "10.0.0.1"
			c.HealthzBindAddress = "1.2.3.4:1"
			c.MetricsBindAddress = "1.2.3.4:2"
			c.BindAddressHardFail = true
			c.EnableProfiling = true
			c.FeatureGates["X"] = true
			*c.OOMScoreAdj = 0
			c.ConfigSyncPeriod.Duration = time.Hour
			c.Logging.Format = "json"
			c.Conntrack.TCPBeLiberal = true
			*c.Conntrack.Min = 1
			c.Winkernel.NetworkName = "n"
		}, nil, []string{"featureGates", "clientConnection.kubeconfig", "clientConnection.qps", "logging.format",
			"hostnameOverride", "bindAddress", "healthzBindAddress", "metricsBindAddress", "bindAddressHardFail", "enableProfiling",
			"mode", "winkernel.networkName", "oomScoreAdj", "conntrack.min", "conntrack.tcpBeLiberal", "configSyncPeriod"}},
		{"both kinds at once", func(c *KubeProxyConfiguration) {
			c.Conntrack.UDPTimeout.Duration = time.Second
			c.IPTables.SyncPeriod.Duration = 10 * time.Second
		}, []string{"iptables.syncPeriod"}, []string{"conntrack.udpTimeout"}},
		{"nil pointer against default", func(c *KubeProxyConfiguration) { c.Conntrack.MaxPerCore = nil }, nil, []string{"conntrack.maxPerCore"}},
		{"equal quantities are no change", func(c *KubeProxyConfiguration) {
			c.Logging.Options.Text.InfoBufferSize = resource.QuantityValue{Quantity: resource.MustParse("0")}
		}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, new := Default(), Default()
			tt.change(new)
			live, restart := ReloadPlan(old, new)
			if diff := cmp.Diff(tt.live, live); diff != "" {
				t.Errorf("live (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.restart, restart); diff != "" {
				t.Errorf("restart (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReloadClassComplete makes a new field fail until someone decides
// whether it can be applied live.
func TestReloadClassComplete(t *testing.T) {
	for _, p := range leafPaths() {
		found := false
		for q := p; q != "" && !found; q = parentPath(q) {
			_, found = reloadClass[q]
		}
		if !found {
			t.Errorf("field %q has no reload class", p)
		}
	}
	for p := range reloadClass {
		if !slices.ContainsFunc(leafPaths(), func(l string) bool { return l == p || strings.HasPrefix(l, p+".") }) {
			t.Errorf("reload class for %q names no field", p)
		}
	}
}
