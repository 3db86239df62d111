package config

import (
	"net"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Default values, as upstream kube-proxy v1.37 sets them for v1alpha1.
const (
	DefaultBindAddress       = "0.0.0.0"
	DefaultHealthzPort       = 10256
	DefaultMetricsPort       = 10249
	DefaultOOMScoreAdj       = -999
	DefaultSyncPeriod        = 30 * time.Second
	DefaultMinSyncPeriod     = 1 * time.Second
	DefaultMasqueradeBit     = 14
	DefaultConntrackPerCore  = 32 * 1024
	DefaultConntrackMin      = 128 * 1024
	DefaultTCPEstablished    = 24 * time.Hour
	DefaultTCPCloseWait      = 1 * time.Hour
	DefaultConfigSyncPeriod  = 15 * time.Minute
	DefaultContentType       = "application/vnd.kubernetes.protobuf"
	DefaultQPS               = 5
	DefaultBurst             = 10
	DefaultLogFormat         = "text"
	DefaultLogFlushFrequency = 5 * time.Second
	DefaultIPVSScheduler     = "rr"
)

// Default returns a fully defaulted configuration: what a file holding only
// apiVersion and kind decodes to.
func Default() *KubeProxyConfiguration {
	c := &KubeProxyConfiguration{}
	SetDefaults(c)
	return c
}

// SetDefaults fills the fields of c that are unset with upstream's defaults
// and sets apiVersion and kind.
//
// Like upstream, "unset" means the zero value for non-pointer fields: the
// sync periods are plain durations there, so an explicit "minSyncPeriod: 0s"
// cannot be told from an absent one, and iptables.minSyncPeriod and
// nftables.minSyncPeriod become 1s either way (upstream behaves the same; to
// sync on every change, pass --iptables-min-sync-period=0 on the command line,
// which is applied after defaulting). ipvs.minSyncPeriod has no default and
// stays 0. Pointer fields (oomScoreAdj, masqueradeBit, localhostNodePorts,
// conntrack.maxPerCore/min/tcp*Timeout) are defaulted only when absent or
// null, so an explicit 0 or false is kept.
//
// Beyond upstream's v1alpha1 defaults it applies upstream's Linux platform
// defaults (empty mode is iptables, empty detectLocalMode is ClusterCIDR) and
// sets an empty ipvs.scheduler to "rr", which is what upstream's IPVS proxier
// uses for an empty scheduler.
func SetDefaults(c *KubeProxyConfiguration) {
	c.APIVersion = APIVersion
	c.Kind = Kind

	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}

	cc := &c.ClientConnection
	if cc.ContentType == "" {
		cc.ContentType = DefaultContentType
	}
	if cc.QPS == 0 {
		cc.QPS = DefaultQPS
	}
	if cc.Burst == 0 {
		cc.Burst = DefaultBurst
	}

	l := &c.Logging
	if l.Format == "" {
		l.Format = DefaultLogFormat
	}
	if l.FlushFrequency.Duration.Duration == 0 {
		l.FlushFrequency = TimeOrMetaDuration{Duration: metav1.Duration{Duration: DefaultLogFlushFrequency}, SerializeAsString: true}
	}
	defaultBufferSize(&l.Options.Text.InfoBufferSize)
	defaultBufferSize(&l.Options.JSON.InfoBufferSize)

	if c.BindAddress == "" {
		c.BindAddress = DefaultBindAddress
	}
	healthzHost, metricsHost := "0.0.0.0", "127.0.0.1"
	if ip := parseIP(c.BindAddress); ip == nil || ip.To4() == nil {
		// Upstream switches to IPv6 hosts for anything that is not IPv4,
		// including an unparsable bindAddress (validation reports that).
		healthzHost, metricsHost = "::", "::1"
	}
	c.HealthzBindAddress = defaultHostPort(c.HealthzBindAddress, healthzHost, DefaultHealthzPort)
	c.MetricsBindAddress = defaultHostPort(c.MetricsBindAddress, metricsHost, DefaultMetricsPort)

	if c.Mode == "" {
		c.Mode = ModeIPTables
	}

	it := &c.IPTables
	if it.MasqueradeBit == nil {
		it.MasqueradeBit = ptr[int32](DefaultMasqueradeBit)
	}
	if it.LocalhostNodePorts == nil {
		it.LocalhostNodePorts = ptr(true)
	}
	defaultDuration(&it.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&it.MinSyncPeriod, DefaultMinSyncPeriod)

	defaultDuration(&c.IPVS.SyncPeriod, DefaultSyncPeriod)
	if c.IPVS.Scheduler == "" {
		c.IPVS.Scheduler = DefaultIPVSScheduler
	}

	nft := &c.NFTables
	if nft.MasqueradeBit == nil {
		nft.MasqueradeBit = ptr[int32](DefaultMasqueradeBit)
	}
	defaultDuration(&nft.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&nft.MinSyncPeriod, DefaultMinSyncPeriod)

	if c.DetectLocalMode == "" {
		c.DetectLocalMode = LocalModeClusterCIDR
	}

	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptr[int32](DefaultOOMScoreAdj)
	}
	ct := &c.Conntrack
	if ct.MaxPerCore == nil {
		ct.MaxPerCore = ptr[int32](DefaultConntrackPerCore)
	}
	if ct.Min == nil {
		ct.Min = ptr[int32](DefaultConntrackMin)
	}
	if ct.TCPEstablishedTimeout == nil {
		ct.TCPEstablishedTimeout = &metav1.Duration{Duration: DefaultTCPEstablished}
	}
	if ct.TCPCloseWaitTimeout == nil {
		ct.TCPCloseWaitTimeout = &metav1.Duration{Duration: DefaultTCPCloseWait}
	}
	defaultDuration(&c.ConfigSyncPeriod, DefaultConfigSyncPeriod)
}

// applyPlatformDefaults sets what upstream decides once the file and the flags are read: an empty mode
// (--proxy-mode="") is iptables, and in mode nftables an empty nodePortAddresses means the node's primary
// IPs ("primary"), not every local address.
func (c *KubeProxyConfiguration) applyPlatformDefaults() {
	if c.Mode == "" {
		c.Mode = ModeIPTables
	}
	c.NodePortAddresses = c.EffectiveNodePortAddresses()
}

func defaultDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

// defaultBufferSize sets an absent infoBufferSize to a zero quantity, the way
// upstream does, so that the file and --write-config-to show "0".
func defaultBufferSize(q *resource.QuantityValue) {
	if q.Quantity == (resource.Quantity{}) {
		q.Quantity = *resource.NewQuantity(0, resource.DecimalSI)
	}
}

// defaultHostPort returns host:port for an empty addr, appends port to a bare
// IP, and leaves anything else (ip:port, or garbage for Validate) unchanged.
func defaultHostPort(addr, host string, port int) string {
	if addr == "" {
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	return appendPortIfNeeded(addr, port)
}

func appendPortIfNeeded(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	if parseIP(addr) == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(port))
}

func ptr[T any](v T) *T { return &v }
