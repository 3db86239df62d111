package config

import (
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GroupName is the API group of the configuration file.
const GroupName = "kubeproxy.config.k8s.io"

// APIVersion is the only apiVersion the configuration file may declare.
const APIVersion = GroupName + "/v1alpha1"

// Kind is the only kind the configuration file may declare.
const Kind = "KubeProxyConfiguration"

// ProxyMode names a dataplane implementation ("mode" in the file).
type ProxyMode string

// The proxy modes upstream knows, and ModeUserspace. This kube-proxy runs
// ModeIPTables, ModeIPVS, ModeNFTables and ModeUserspace; Windows'
// ModeKernelspace is rejected by Validate with an explanation.
const (
	ModeIPTables    ProxyMode = "iptables"
	ModeIPVS        ProxyMode = "ipvs"
	ModeNFTables    ProxyMode = "nftables"
	ModeKernelspace ProxyMode = "kernelspace"
	// ModeUserspace is the seed design's third mode, which upstream removed in 1.26: the daemon itself
	// proxies each Service port. This project's extension.
	ModeUserspace ProxyMode = "userspace"
)

// LocalMode names how traffic from local pods is recognised
// ("detectLocalMode" in the file).
type LocalMode string

// The local-traffic detection modes upstream knows.
const (
	// LocalModeClusterCIDR treats sources inside clusterCIDR as local.
	LocalModeClusterCIDR LocalMode = "ClusterCIDR"
	// LocalModeNodeCIDR treats sources inside the Node's spec.podCIDRs as local.
	LocalModeNodeCIDR LocalMode = "NodeCIDR"
	// LocalModeBridgeInterface treats packets arriving on detectLocal.bridgeInterface as local.
	LocalModeBridgeInterface LocalMode = "BridgeInterface"
	// LocalModeInterfaceNamePrefix treats packets arriving on interfaces named
	// detectLocal.interfaceNamePrefix* as local.
	LocalModeInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// Keywords accepted in nodePortAddresses besides CIDRs.
const (
	// NodePortAddressesPrimary stands for the Node's primary IPv4 and/or IPv6 addresses.
	NodePortAddressesPrimary = "primary"
	// NodePortAddressesLocalhost stands for 127.0.0.0/8 and ::1/128.
	NodePortAddressesLocalhost = "localhost"
	// NodePortAddressesAll stands for 0.0.0.0/0 and ::/0.
	NodePortAddressesAll = "all"
)

// KubeProxyConfiguration is the whole configuration file. Field names, JSON
// names, pointer-ness and order follow upstream's v1alpha1 type so that the
// same YAML decodes and encodes identically.
type KubeProxyConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// FeatureGates switches named features on or off.
	FeatureGates map[string]bool `json:"featureGates,omitempty"`

	// ClientConnection says how to reach the API server.
	ClientConnection ClientConnectionConfiguration `json:"clientConnection"`
	// Logging configures the log output.
	Logging LoggingConfiguration `json:"logging,omitempty"`

	// HostnameOverride, when set, is the name of this node's Node object;
	// otherwise the hostname is used.
	HostnameOverride string `json:"hostnameOverride"`
	// BindAddress is taken as the node's primary IP (no socket is bound to it).
	BindAddress string `json:"bindAddress"`
	// HealthzBindAddress is the ip:port of the health server.
	HealthzBindAddress string `json:"healthzBindAddress"`
	// MetricsBindAddress is the ip:port of the metrics server.
	MetricsBindAddress string `json:"metricsBindAddress"`
	// BindAddressHardFail makes a failure to listen on those ports fatal.
	BindAddressHardFail bool `json:"bindAddressHardFail"`
	// EnableProfiling serves /debug/pprof on the metrics server.
	EnableProfiling bool `json:"enableProfiling"`
	// ShowHiddenMetricsForVersion re-enables metrics hidden since that version.
	ShowHiddenMetricsForVersion string `json:"showHiddenMetricsForVersion"`

	// Mode selects the dataplane.
	Mode ProxyMode `json:"mode"`
	// IPTables holds settings of the iptables mode (some also apply to ipvs).
	IPTables IPTablesConfiguration `json:"iptables"`
	// IPVS holds settings of the ipvs mode.
	IPVS IPVSConfiguration `json:"ipvs"`
	// NFTables holds settings of the nftables mode.
	NFTables NFTablesConfiguration `json:"nftables"`
	// Winkernel holds settings of upstream's Windows mode (accepted, ignored).
	Winkernel WinkernelConfiguration `json:"winkernel"`

	// DetectLocalMode selects how local pod traffic is recognised.
	DetectLocalMode LocalMode `json:"detectLocalMode"`
	// DetectLocal holds the parameters of the interface-based detect modes.
	DetectLocal DetectLocalConfiguration `json:"detectLocal"`
	// ClusterCIDR is the pod CIDR, or a comma-separated dual-stack pair.
	ClusterCIDR string `json:"clusterCIDR"`

	// NodePortAddresses limits the node IPs NodePorts answer on: CIDRs and the
	// keywords "primary", "localhost" and "all". Empty means all.
	NodePortAddresses []string `json:"nodePortAddresses"`

	// OOMScoreAdj is the process's oom_score_adj, within [-1000, 1000].
	OOMScoreAdj *int32 `json:"oomScoreAdj"`
	// Conntrack holds the conntrack sysctls set at start.
	Conntrack ConntrackConfiguration `json:"conntrack"`
	// ConfigSyncPeriod is the resync period of the Node informer (Services and EndpointSlices are
	// watched without one).
	ConfigSyncPeriod metav1.Duration `json:"configSyncPeriod"`

	// PortRange is unused (it belonged to the removed userspace proxy).
	PortRange string `json:"portRange"`
	// UDPIdleTimeout is how long mode userspace keeps a UDP flow without packets; 0 means 250ms, the
	// default of upstream's userspace mode. Upstream removed the field in v1.26 with that mode; only mode
	// userspace, this project's extension, reads it. Left out of --write-config-to when 0.
	UDPIdleTimeout metav1.Duration `json:"udpIdleTimeout,omitzero"`

	// WindowsRunAsService is a Windows-only setting, accepted and ignored.
	WindowsRunAsService bool `json:"windowsRunAsService,omitempty"`
}

// ClientConnectionConfiguration says how to talk to the API server.
type ClientConnectionConfiguration struct {
	// Kubeconfig is the path of the kubeconfig file; empty means in-cluster.
	Kubeconfig string `json:"kubeconfig"`
	// AcceptContentTypes is the Accept header of requests.
	AcceptContentTypes string `json:"acceptContentTypes"`
	// ContentType is the content type of request bodies.
	ContentType string `json:"contentType"`
	// QPS is the client-side rate limit.
	QPS float32 `json:"qps"`
	// Burst is the client-side rate limiter's burst.
	Burst int32 `json:"burst"`
}

// LoggingConfiguration mirrors component-base's logging options.
type LoggingConfiguration struct {
	// Format is "text" or "json".
	Format string `json:"format,omitempty"`
	// FlushFrequency is the longest time between log flushes.
	FlushFrequency TimeOrMetaDuration `json:"flushFrequency"`
	// Verbosity is the klog -v level.
	Verbosity VerbosityLevel `json:"verbosity"`
	// VModule sets per-file verbosity (text format only).
	VModule VModuleConfiguration `json:"vmodule,omitempty"`
	// Options holds per-format alpha options.
	Options FormatOptions `json:"options,omitempty"`
}

// VerbosityLevel is a klog verbosity threshold.
type VerbosityLevel uint32

// VModuleConfiguration is a list of per-file verbosity overrides.
type VModuleConfiguration []VModuleItem

// VModuleItem sets the verbosity of the files matching FilePattern.
type VModuleItem struct {
	// FilePattern is a file base name without ".go", or a glob of such names.
	FilePattern string `json:"filePattern"`
	// Verbosity applies to matching files.
	Verbosity VerbosityLevel `json:"verbosity"`
}

// FormatOptions holds the options of each log format.
type FormatOptions struct {
	// Text applies to the text format.
	Text TextOptions `json:"text,omitempty"`
	// JSON applies to the json format.
	JSON JSONOptions `json:"json,omitempty"`
}

// TextOptions are the text format's options.
type TextOptions struct {
	OutputRoutingOptions `json:",inline"`
}

// JSONOptions are the json format's options.
type JSONOptions struct {
	OutputRoutingOptions `json:",inline"`
}

// OutputRoutingOptions splits info and error output (alpha upstream: needs
// the LoggingAlphaOptions feature gate).
type OutputRoutingOptions struct {
	// SplitStream sends errors to stderr and info to stdout.
	SplitStream bool `json:"splitStream,omitempty"`
	// InfoBufferSize buffers stdout when SplitStream is on.
	InfoBufferSize resource.QuantityValue `json:"infoBufferSize,omitempty"`
}

// TimeOrMetaDuration is a duration written either as a string ("5s") or as
// an integer number of nanoseconds, and re-encoded the way it was written.
type TimeOrMetaDuration struct {
	// Duration is the value.
	Duration metav1.Duration
	// SerializeAsString is true when the value was (or should be) written as a string.
	SerializeAsString bool `json:"-"`
}

// MarshalJSON writes a string when SerializeAsString is set, else nanoseconds.
func (t TimeOrMetaDuration) MarshalJSON() ([]byte, error) {
	if t.SerializeAsString {
		return t.Duration.MarshalJSON()
	}
	return json.Marshal(int64(t.Duration.Duration))
}

// UnmarshalJSON accepts a duration string or an integer number of nanoseconds.
func (t *TimeOrMetaDuration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		t.SerializeAsString = true
		return t.Duration.UnmarshalJSON(b)
	}
	var ns int64
	if err := json.Unmarshal(b, &ns); err != nil {
		return fmt.Errorf("invalid duration %s: want a string like \"5s\" or integer nanoseconds", b)
	}
	t.SerializeAsString = false
	t.Duration.Duration = time.Duration(ns)
	return nil
}

// IPTablesConfiguration holds the iptables mode's settings.
type IPTablesConfiguration struct {
	// MasqueradeBit is the fwmark bit (0..31) marking packets to SNAT (iptables and ipvs).
	MasqueradeBit *int32 `json:"masqueradeBit"`
	// MasqueradeAll SNATs all traffic to Service cluster IPs (iptables and ipvs).
	MasqueradeAll bool `json:"masqueradeAll"`
	// LocalhostNodePorts allows NodePorts on 127.0.0.0/8 (iptables, IPv4).
	LocalhostNodePorts *bool `json:"localhostNodePorts"`
	// SyncPeriod is the interval of full resyncs.
	SyncPeriod metav1.Duration `json:"syncPeriod"`
	// MinSyncPeriod is the least time between two syncs.
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
}

// IPVSConfiguration holds the ipvs mode's settings.
type IPVSConfiguration struct {
	// SyncPeriod is the interval of full resyncs.
	SyncPeriod metav1.Duration `json:"syncPeriod"`
	// MinSyncPeriod is the least time between two syncs.
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
	// Scheduler is the IPVS scheduler of every virtual server.
	Scheduler string `json:"scheduler"`
	// ExcludeCIDRs are left alone when stale IPVS services are removed.
	ExcludeCIDRs []string `json:"excludeCIDRs"`
	// StrictARP sets arp_ignore=1 and arp_announce=2.
	StrictARP bool `json:"strictARP"`
	// TCPTimeout is the IPVS idle TCP timeout; 0 keeps the kernel's.
	TCPTimeout metav1.Duration `json:"tcpTimeout"`
	// TCPFinTimeout is the IPVS TCP timeout after FIN; 0 keeps the kernel's.
	TCPFinTimeout metav1.Duration `json:"tcpFinTimeout"`
	// UDPTimeout is the IPVS UDP timeout; 0 keeps the kernel's.
	UDPTimeout metav1.Duration `json:"udpTimeout"`
}

// NFTablesConfiguration holds the settings of upstream's nftables mode.
type NFTablesConfiguration struct {
	// MasqueradeBit is the fwmark bit (0..31) marking packets to SNAT.
	MasqueradeBit *int32 `json:"masqueradeBit"`
	// MasqueradeAll SNATs all traffic to Service cluster IPs.
	MasqueradeAll bool `json:"masqueradeAll"`
	// SyncPeriod is the interval of full resyncs.
	SyncPeriod metav1.Duration `json:"syncPeriod"`
	// MinSyncPeriod is the least time between two syncs.
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
}

// ConntrackConfiguration holds the conntrack sysctls kube-proxy sets at start.
type ConntrackConfiguration struct {
	// MaxPerCore is nf_conntrack_max per CPU; 0 leaves the limit (and Min) alone.
	MaxPerCore *int32 `json:"maxPerCore"`
	// Min is the least nf_conntrack_max, whatever MaxPerCore gives.
	Min *int32 `json:"min"`
	// TCPEstablishedTimeout is nf_conntrack_tcp_timeout_established; 0 leaves it.
	TCPEstablishedTimeout *metav1.Duration `json:"tcpEstablishedTimeout"`
	// TCPCloseWaitTimeout is nf_conntrack_tcp_timeout_close_wait; 0 leaves it.
	TCPCloseWaitTimeout *metav1.Duration `json:"tcpCloseWaitTimeout"`
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal=1.
	TCPBeLiberal bool `json:"tcpBeLiberal"`
	// UDPTimeout is nf_conntrack_udp_timeout; 0 leaves it.
	UDPTimeout metav1.Duration `json:"udpTimeout"`
	// UDPStreamTimeout is nf_conntrack_udp_timeout_stream; 0 leaves it.
	UDPStreamTimeout metav1.Duration `json:"udpStreamTimeout"`
}

// WinkernelConfiguration holds Windows settings; accepted and ignored here.
type WinkernelConfiguration struct {
	// NetworkName is the HNS network name.
	NetworkName string `json:"networkName"`
	// SourceVip is the source VIP used for NAT.
	SourceVip string `json:"sourceVip"`
	// EnableDSR turns on direct server return.
	EnableDSR bool `json:"enableDSR"`
	// RootHnsEndpointName is the HNS endpoint of the root namespace.
	RootHnsEndpointName string `json:"rootHnsEndpointName"`
	// ForwardHealthCheckVip forwards the Service VIP of health-check ports.
	ForwardHealthCheckVip bool `json:"forwardHealthCheckVip"`
}

// DetectLocalConfiguration holds the interface parameters of detectLocalMode.
type DetectLocalConfiguration struct {
	// BridgeInterface is used with detectLocalMode BridgeInterface.
	BridgeInterface string `json:"bridgeInterface"`
	// InterfaceNamePrefix is used with detectLocalMode InterfaceNamePrefix.
	InterfaceNamePrefix string `json:"interfaceNamePrefix"`
}

// EffectiveMode returns the mode that runs: c.Mode, or iptables when it is empty. Load sets an empty mode
// to iptables already (upstream's default on Linux); a configuration built in code may still have none.
func (c *KubeProxyConfiguration) EffectiveMode() ProxyMode {
	if c.Mode == "" {
		return ModeIPTables
	}
	return c.Mode
}

// Masquerade returns the masqueradeAll and masqueradeBit the configured mode reads: nftables.* in mode
// nftables, iptables.* in every other mode (as upstream), an unset bit being the default. A bit outside
// 0..31, which Validate refuses, is an error naming its field.
func (c *KubeProxyConfiguration) Masquerade() (all bool, bit int, err error) {
	field, all, b := "iptables.masqueradeBit", c.IPTables.MasqueradeAll, c.IPTables.MasqueradeBit
	if c.EffectiveMode() == ModeNFTables {
		field, all, b = "nftables.masqueradeBit", c.NFTables.MasqueradeAll, c.NFTables.MasqueradeBit
	}
	if b == nil {
		return all, DefaultMasqueradeBit, nil
	}
	if *b < 0 || *b > 31 {
		return false, 0, fmt.Errorf("%s: %d is out of range; must be within [0, 31]", field, *b)
	}
	return all, int(*b), nil
}

// EffectiveNodePortAddresses returns nodePortAddresses with upstream's platform default applied: in mode
// nftables an empty list means the node's primary IPs ("primary"), in the other modes every local address.
// Load applies it already; a configuration built in code may not have it.
func (c *KubeProxyConfiguration) EffectiveNodePortAddresses() []string {
	if c.EffectiveMode() == ModeNFTables && len(c.NodePortAddresses) == 0 {
		return []string{NodePortAddressesPrimary}
	}
	return c.NodePortAddresses
}

// SyncPeriods returns the sync period and minimum sync period of the
// configured mode: ipvs.* in ipvs mode, nftables.* in nftables mode and
// iptables.* otherwise (also for an empty mode, which means iptables, and for
// mode userspace, whose capture rules are iptables rules).
func (c *KubeProxyConfiguration) SyncPeriods() (syncPeriod, minSyncPeriod time.Duration) {
	switch c.Mode {
	case ModeIPVS:
		return c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration
	case ModeNFTables:
		return c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	default:
		return c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
	}
}
