package config

import (
	"fmt"
	"math"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UpstreamVersion is the upstream kube-proxy release whose configuration
// this package mirrors; showHiddenMetricsForVersion may only name the minor
// release before it.
const UpstreamVersion = "1.37"

// UpstreamRelease is the upstream Kubernetes release this kube-proxy stands in for: `--version` prints it on
// its first line, as upstream does, and /statusz reports it as the binary version.
const UpstreamRelease = "v1.37.2"

// Modes this kube-proxy can run.
var supportedModes = []ProxyMode{ModeIPTables, ModeIPVS, ModeNFTables, ModeUserspace}

// ipvsSchedulers are the schedulers of the Linux IPVS module.
var ipvsSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

// Validate checks c, which should already be defaulted, with upstream's rules
// plus this implementation's limits, and returns every problem found, joined
// with errors.Join, each a *FieldError. It returns nil for a valid config.
//
// As upstream does, the settings of a mode section (ipvs.*, nftables.*) and
// the sync periods are checked only for the selected mode, so a file with
// leftovers of another mode still loads.
func (c *KubeProxyConfiguration) Validate() error {
	if errs, _ := c.validate(); len(errs) > 0 {
		return joinFieldErrors(errs)
	}
	return nil
}

// validator collects the errors and the warnings of one validation.
type validator struct{ errs, warns []*FieldError }

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) warn(field, format string, args ...any) {
	v.warns = append(v.warns, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// validate returns the problems of c and the warnings about settings that are accepted but do nothing
// or will stop working.
func (c *KubeProxyConfiguration) validate() (errs, warns []*FieldError) {
	v := &validator{}
	c.validateTypeMeta(v)
	v.validateFeatureGates(c.FeatureGates)
	c.validateClientConnection(v)
	c.validateLogging(v)
	c.validateServing(v)
	c.validateMode(v)
	c.validateModeSections(v)
	c.validateDetectLocal(v)
	c.validateNodePortAddresses(v)
	if a := c.OOMScoreAdj; a != nil && (*a < -1000 || *a > 1000) {
		v.add("oomScoreAdj", "%d is out of range; must be within [-1000, 1000]", *a)
	}
	c.validateConntrack(v)
	if c.ConfigSyncPeriod.Duration <= 0 {
		v.add("configSyncPeriod", "%s must be greater than 0", c.ConfigSyncPeriod.Duration)
	}
	c.validateUserspaceFields(v)
	return v.errs, v.warns
}

func (c *KubeProxyConfiguration) validateTypeMeta(v *validator) {
	if c.APIVersion != "" && c.APIVersion != APIVersion {
		v.add("apiVersion", "%q is not supported; want %s", c.APIVersion, APIVersion)
	}
	if c.Kind != "" && c.Kind != Kind {
		v.add("kind", "%q is not supported; want %s", c.Kind, Kind)
	}
}

func (c *KubeProxyConfiguration) validateClientConnection(v *validator) {
	cc := c.ClientConnection
	if cc.QPS < 0 || math.IsNaN(float64(cc.QPS)) {
		v.add("clientConnection.qps", "%v must not be negative", cc.QPS)
	}
	if cc.Burst < 0 {
		v.add("clientConnection.burst", "%d must not be negative", cc.Burst)
	}
}

// validateServing checks what the daemon serves on: its bind address, the healthz and metrics servers.
func (c *KubeProxyConfiguration) validateServing(v *validator) {
	if parseIP(c.BindAddress) == nil {
		v.add("bindAddress", "%q is not an IP address", c.BindAddress)
	}
	if c.HealthzBindAddress != "" {
		if msg := validateHostPort(c.HealthzBindAddress); msg != "" {
			v.add("healthzBindAddress", "%s", msg)
		}
	}
	if msg := validateHostPort(c.MetricsBindAddress); msg != "" {
		v.add("metricsBindAddress", "%s", msg)
	}
	if s := c.ShowHiddenMetricsForVersion; s != "" {
		if prev := previousMinor(); s != prev {
			v.add("showHiddenMetricsForVersion", "%q is not allowed: only the previous minor release, %q, may be given (or leave it empty)", s, prev)
		}
	}
}

// validateModeSections checks iptables.masqueradeBit, which every mode but nftables reads, then the
// section of the selected mode and its sync periods.
func (c *KubeProxyConfiguration) validateModeSections(v *validator) {
	if b := c.IPTables.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
		v.add("iptables.masqueradeBit", "%d is out of range; must be within [0, 31]", *b)
	}
	switch c.Mode {
	case ModeIPVS:
		c.validateIPVS(v)
	case ModeNFTables:
		if b := c.NFTables.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
			v.add("nftables.masqueradeBit", "%d is out of range; must be within [0, 31]", *b)
		}
	}
	c.validateSyncPeriods(v)
}

func (c *KubeProxyConfiguration) validateNodePortAddresses(v *validator) {
	seen := map[string]bool{}
	for i, a := range c.NodePortAddresses {
		f := indexPath("nodePortAddresses", i)
		switch a {
		case NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll:
			if seen[a] {
				v.add(f, "keyword %q is listed twice", a)
			}
			seen[a] = true
			continue
		}
		if _, err := parseCIDR(a); err != nil {
			v.add(f, "%s; entries must be CIDRs or one of the keywords %q, %q, %q", err, NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll)
		}
	}
}

func (c *KubeProxyConfiguration) validateConntrack(v *validator) {
	ct := c.Conntrack
	if ct.MaxPerCore != nil && *ct.MaxPerCore < 0 {
		v.add("conntrack.maxPerCore", "%d must not be negative (0 leaves the kernel's limit alone)", *ct.MaxPerCore)
	}
	if ct.Min != nil && *ct.Min < 0 {
		v.add("conntrack.min", "%d must not be negative", *ct.Min)
	}
	v.nonNegative("conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout)
	v.nonNegative("conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout)
	v.nonNegative("conntrack.udpTimeout", &ct.UDPTimeout)
	v.nonNegative("conntrack.udpStreamTimeout", &ct.UDPStreamTimeout)
}

// validateUserspaceFields checks the settings of upstream's removed userspace mode, which only mode
// userspace, this kube-proxy's extension, reads.
func (c *KubeProxyConfiguration) validateUserspaceFields(v *validator) {
	if d := c.UDPIdleTimeout; d.Duration != 0 {
		switch {
		case d.Duration < 0:
			v.add("udpIdleTimeout", "%s must not be negative (0 means the default, 250ms)", d.Duration)
		case c.Mode != ModeUserspace:
			v.warn("udpIdleTimeout", "ignored: removed in v1.26 with the userspace proxy mode; only mode userspace, this kube-proxy's extension, reads it")
		}
	}
	if c.PortRange != "" {
		// Upstream still has the field but reads nothing from it, whatever it holds.
		v.warn("portRange", "ignored: it configured the userspace proxy mode, which upstream removed in v1.26")
	}
}

func (v *validator) nonNegative(field string, d *metav1.Duration) {
	if d != nil && d.Duration < 0 {
		v.add(field, "%s must not be negative (0 leaves the kernel's value alone)", d.Duration)
	}
}

func previousMinor() string {
	var major, minor int
	_, _ = fmt.Sscanf(UpstreamVersion, "%d.%d", &major, &minor)
	return fmt.Sprintf("%d.%d", major, minor-1)
}

func (c *KubeProxyConfiguration) validateMode(v *validator) {
	names := make([]string, len(supportedModes))
	for i, m := range supportedModes {
		names[i] = string(m)
	}
	runs := strings.Join(names, " or ")
	switch c.Mode {
	case "", ModeIPTables:
	case ModeIPVS:
		if !c.FeatureEnabled("KubeProxyIPVS") {
			v.add("mode", "ipvs mode needs the KubeProxyIPVS feature gate, which featureGates turns off")
		}
	case ModeNFTables:
	case ModeUserspace:
		// This project's extension: the daemon proxies each Service port itself (docs/MODES.md).
	case ModeKernelspace:
		v.add("mode", "%q is upstream kube-proxy's Windows mode, which this kube-proxy does not implement; use %s", c.Mode, runs)
	default:
		v.add("mode", "unknown mode %q; must be %s (empty means iptables)", c.Mode, runs)
	}
}

func (c *KubeProxyConfiguration) validateIPVS(v *validator) {
	ipvs := c.IPVS
	known := false
	for _, s := range ipvsSchedulers {
		if ipvs.Scheduler == s {
			known = true
		}
	}
	if !known && ipvs.Scheduler != "" {
		v.add("ipvs.scheduler", "unknown IPVS scheduler %q; must be one of %s", ipvs.Scheduler, strings.Join(ipvsSchedulers, ", "))
	}
	for i, s := range ipvs.ExcludeCIDRs {
		if _, err := parseCIDR(s); err != nil {
			v.add(indexPath("ipvs.excludeCIDRs", i), "%s", err)
		}
	}
	v.nonNegative("ipvs.tcpTimeout", &ipvs.TCPTimeout)
	v.nonNegative("ipvs.tcpFinTimeout", &ipvs.TCPFinTimeout)
	v.nonNegative("ipvs.udpTimeout", &ipvs.UDPTimeout)
}

// validateSyncPeriods checks the sync periods of the selected mode.
func (c *KubeProxyConfiguration) validateSyncPeriods(v *validator) {
	section := "iptables"
	switch c.Mode {
	case ModeIPVS:
		section = "ipvs"
	case ModeNFTables:
		section = "nftables"
	}
	sync, minSync := c.SyncPeriods()
	sp, msp := section+".syncPeriod", section+".minSyncPeriod"
	if sync <= 0 {
		v.add(sp, "%s must be greater than 0", sync)
	}
	if minSync < 0 {
		v.add(msp, "%s must not be negative", minSync)
	}
	if sync > 0 && minSync > sync {
		v.add(msp, "%s must not be greater than %s (%s)", minSync, sp, sync)
	}
}

func (c *KubeProxyConfiguration) validateDetectLocal(v *validator) {
	switch c.DetectLocalMode {
	case "", LocalModeClusterCIDR:
		if c.ClusterCIDR != "" {
			c.validateClusterCIDR(v)
		}
	case LocalModeNodeCIDR:
	case LocalModeBridgeInterface:
		if c.DetectLocal.BridgeInterface == "" {
			v.add("detectLocal.bridgeInterface", "must be set when detectLocalMode is %s", LocalModeBridgeInterface)
		}
	case LocalModeInterfaceNamePrefix:
		if c.DetectLocal.InterfaceNamePrefix == "" {
			v.add("detectLocal.interfaceNamePrefix", "must be set when detectLocalMode is %s", LocalModeInterfaceNamePrefix)
		}
	default:
		v.add("detectLocalMode", "unknown mode %q; must be %s, %s, %s or %s", c.DetectLocalMode,
			LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix)
	}
}

// validateClusterCIDR checks a single CIDR or a comma-separated dual-stack pair.
func (c *KubeProxyConfiguration) validateClusterCIDR(v *validator) {
	parts := strings.Split(c.ClusterCIDR, ",")
	if len(parts) > 2 {
		v.add("clusterCIDR", "%q must be one CIDR or a comma-separated dual-stack pair (one IPv4, one IPv6)", c.ClusterCIDR)
		return
	}
	v4 := 0
	for _, p := range parts {
		n, err := parseCIDR(p)
		if err != nil {
			v.add("clusterCIDR", "%s", err)
			return
		}
		if n.IP.To4() != nil {
			v4++
		}
	}
	if len(parts) == 2 && v4 != 1 {
		v.add("clusterCIDR", "%q: a pair must be dual-stack (one IPv4 and one IPv6 CIDR)", c.ClusterCIDR)
	}
}

func (c *KubeProxyConfiguration) validateLogging(v *validator) {
	l := c.Logging
	switch l.Format {
	case "text":
	case "json":
		// As upstream, the json format is gated (beta, on by default).
		if !c.FeatureEnabled("LoggingBetaOptions") {
			v.add("logging.format", "log format json needs the LoggingBetaOptions feature gate, which featureGates turns off")
		}
	default:
		v.add("logging.format", "unsupported log format %q; must be text or json", l.Format)
	}
	if l.FlushFrequency.Duration.Duration <= 0 {
		v.add("logging.flushFrequency", "%s must be greater than 0", l.FlushFrequency.Duration.Duration)
	}
	if l.Verbosity > math.MaxInt32 {
		v.add("logging.verbosity", "%d is too large; must be at most %d", l.Verbosity, math.MaxInt32)
	}
	if len(l.VModule) > 0 && l.Format != "" && l.Format != "text" {
		v.add("logging.vmodule", "only supported with the text log format")
	}
	for i, item := range l.VModule {
		f := indexPath("logging.vmodule", i)
		if item.FilePattern == "" {
			v.add(f+".filePattern", "must not be empty")
		}
		if strings.ContainsAny(item.FilePattern, "=,") {
			v.add(f+".filePattern", "%q must not contain '=' or ','", item.FilePattern)
		}
		if item.Verbosity > math.MaxInt32 {
			v.add(f+".verbosity", "%d is too large; must be at most %d", item.Verbosity, math.MaxInt32)
		}
	}
	alphaOn := c.FeatureEnabled("LoggingAlphaOptions")
	for _, o := range []struct {
		format string
		opts   OutputRoutingOptions
	}{{"text", l.Options.Text.OutputRoutingOptions}, {"json", l.Options.JSON.OutputRoutingOptions}} {
		p := "logging.options." + o.format
		set := o.opts.SplitStream || o.opts.InfoBufferSize.Value() != 0
		switch {
		case set && !alphaOn:
			if o.opts.SplitStream {
				v.add(p+".splitStream", "needs the LoggingAlphaOptions feature gate")
			}
			if o.opts.InfoBufferSize.Value() != 0 {
				v.add(p+".infoBufferSize", "needs the LoggingAlphaOptions feature gate")
			}
		case set && l.Format != o.format:
			v.warn(p, "ignored: these options apply to log format %s, and logging.format is %s", o.format, l.Format)
		case o.opts.InfoBufferSize.Value() > 0 && !o.opts.SplitStream:
			v.warn(p+".infoBufferSize", "ignored: it buffers the info stream, which exists only with splitStream: true")
		}
	}
}
