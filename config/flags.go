package config

import (
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Options holds kube-proxy's command-line flags. The flags that stand for
// configuration fields are kept in a configuration of their own and copied
// over the file's values by Complete when they were given explicitly.
type Options struct {
	// ConfigFile is --config, the path of the KubeProxyConfiguration file.
	ConfigFile string
	// WriteConfigTo is --write-config-to: write the effective config there and exit.
	WriteConfigTo string
	// Cleanup is --cleanup: remove the rules kube-proxy made and exit.
	Cleanup bool
	// Version is --version: print the version and exit (true, raw), or set the version reported (vX.Y.Z).
	Version VersionFlag
	// InitOnly is --init-only: do the privileged setup (sysctls) and exit.
	InitOnly bool
	// Master is --master, the API server URL overriding the kubeconfig's.
	Master string

	flags    *KubeProxyConfiguration // targets of the config-field flags
	hostname string                  // --hostname-override
	// ports holds the deprecated --healthz-port and --metrics-port, by flag name.
	ports map[string]*int32
}

// NewOptions returns Options whose config-field flags show upstream's defaults.
func NewOptions() *Options {
	return &Options{flags: Default()}
}

// fieldFlag ties a flag to the configuration field it sets.
type fieldFlag struct {
	flag  string
	field string
}

// fieldFlags lists every flag that maps to a configuration field. When given
// explicitly, each overrides the field from the file, even when --config is
// used (upstream ignores most of them with --config; here the command line
// always wins, so what you type is what runs):
//
//	--feature-gates                      featureGates (merged: the flag's gates win)
//	--kubeconfig                         clientConnection.kubeconfig
//	--kube-api-content-type              clientConnection.contentType
//	--kube-api-qps                       clientConnection.qps
//	--kube-api-burst                     clientConnection.burst
//	--logging-format                     logging.format
//	--log-flush-frequency                logging.flushFrequency
//	--v                                  logging.verbosity (klog's flag, registered by main)
//	--vmodule                            logging.vmodule (klog's flag, registered by main; flag entries first)
//	--log-text-split-stream              logging.options.text.splitStream
//	--log-text-info-buffer-size          logging.options.text.infoBufferSize
//	--log-json-split-stream              logging.options.json.splitStream
//	--log-json-info-buffer-size          logging.options.json.infoBufferSize
//	--hostname-override                  hostnameOverride (trimmed, lower-cased; empty is ignored)
//	--bind-address                       bindAddress
//	--healthz-bind-address               healthzBindAddress (":10256" added to a bare IP)
//	--metrics-bind-address               metricsBindAddress (":10249" added to a bare IP)
//	--bind-address-hard-fail             bindAddressHardFail
//	--profiling                          enableProfiling
//	--show-hidden-metrics-for-version    showHiddenMetricsForVersion
//	--proxy-mode                         mode
//	--iptables-masquerade-bit            iptables.masqueradeBit
//	--masquerade-all                     iptables.masqueradeAll (and nftables.masqueradeAll in mode nftables)
//	--iptables-localhost-nodeports       iptables.localhostNodePorts
//	--iptables-sync-period               iptables.syncPeriod (and nftables.syncPeriod in mode nftables)
//	--iptables-min-sync-period           iptables.minSyncPeriod (0 is kept: sync on every change; and
//	                                     nftables.minSyncPeriod in mode nftables)
//	--ipvs-sync-period                   ipvs.syncPeriod
//	--ipvs-min-sync-period               ipvs.minSyncPeriod
//	--ipvs-scheduler                     ipvs.scheduler
//	--ipvs-exclude-cidrs                 ipvs.excludeCIDRs
//	--ipvs-strict-arp                    ipvs.strictARP
//	--ipvs-tcp-timeout                   ipvs.tcpTimeout
//	--ipvs-tcpfin-timeout                ipvs.tcpFinTimeout
//	--ipvs-udp-timeout                   ipvs.udpTimeout
//	--detect-local-mode                  detectLocalMode
//	--pod-bridge-interface               detectLocal.bridgeInterface
//	--pod-interface-name-prefix          detectLocal.interfaceNamePrefix
//	--cluster-cidr                       clusterCIDR
//	--nodeport-addresses                 nodePortAddresses
//	--oom-score-adj                      oomScoreAdj
//	--conntrack-max-per-core             conntrack.maxPerCore
//	--conntrack-min                      conntrack.min
//	--conntrack-tcp-timeout-established  conntrack.tcpEstablishedTimeout
//	--conntrack-tcp-timeout-close-wait   conntrack.tcpCloseWaitTimeout
//	--conntrack-tcp-be-liberal           conntrack.tcpBeLiberal
//	--conntrack-udp-timeout              conntrack.udpTimeout
//	--conntrack-udp-timeout-stream       conntrack.udpStreamTimeout
//	--config-sync-period                 configSyncPeriod
//
// Flags that are not configuration fields: --config, --write-config-to,
// --cleanup, --init-only, --version, --master, --help. The deprecated
// --healthz-port and --metrics-port (see portFlags) set the port of
// healthzBindAddress and metricsBindAddress as upstream does. --windows-service,
// upstream's Windows-only flag, is registered, hidden, and fails with a message
// saying what to use instead.
var fieldFlags = []fieldFlag{
	{"feature-gates", "featureGates"},
	{"kubeconfig", "clientConnection.kubeconfig"},
	{"kube-api-content-type", "clientConnection.contentType"},
	{"kube-api-qps", "clientConnection.qps"},
	{"kube-api-burst", "clientConnection.burst"},
	{"logging-format", "logging.format"},
	{"log-flush-frequency", "logging.flushFrequency"},
	{"v", "logging.verbosity"},
	{"vmodule", "logging.vmodule"},
	{"log-text-split-stream", "logging.options.text.splitStream"},
	{"log-text-info-buffer-size", "logging.options.text.infoBufferSize"},
	{"log-json-split-stream", "logging.options.json.splitStream"},
	{"log-json-info-buffer-size", "logging.options.json.infoBufferSize"},
	{"hostname-override", "hostnameOverride"},
	{"bind-address", "bindAddress"},
	{"healthz-bind-address", "healthzBindAddress"},
	{"metrics-bind-address", "metricsBindAddress"},
	{"bind-address-hard-fail", "bindAddressHardFail"},
	{"profiling", "enableProfiling"},
	{"show-hidden-metrics-for-version", "showHiddenMetricsForVersion"},
	{"proxy-mode", "mode"},
	{"iptables-masquerade-bit", "iptables.masqueradeBit"},
	{"masquerade-all", "iptables.masqueradeAll"},
	{"iptables-localhost-nodeports", "iptables.localhostNodePorts"},
	{"iptables-sync-period", "iptables.syncPeriod"},
	{"iptables-min-sync-period", "iptables.minSyncPeriod"},
	{"ipvs-sync-period", "ipvs.syncPeriod"},
	{"ipvs-min-sync-period", "ipvs.minSyncPeriod"},
	{"ipvs-scheduler", "ipvs.scheduler"},
	{"ipvs-exclude-cidrs", "ipvs.excludeCIDRs"},
	{"ipvs-strict-arp", "ipvs.strictARP"},
	{"ipvs-tcp-timeout", "ipvs.tcpTimeout"},
	{"ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout"},
	{"ipvs-udp-timeout", "ipvs.udpTimeout"},
	{"detect-local-mode", "detectLocalMode"},
	{"pod-bridge-interface", "detectLocal.bridgeInterface"},
	{"pod-interface-name-prefix", "detectLocal.interfaceNamePrefix"},
	{"cluster-cidr", "clusterCIDR"},
	{"nodeport-addresses", "nodePortAddresses"},
	{"oom-score-adj", "oomScoreAdj"},
	{"conntrack-max-per-core", "conntrack.maxPerCore"},
	{"conntrack-min", "conntrack.min"},
	{"conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout"},
	{"conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout"},
	{"conntrack-tcp-be-liberal", "conntrack.tcpBeLiberal"},
	{"conntrack-udp-timeout", "conntrack.udpTimeout"},
	{"conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout"},
	{"config-sync-period", "configSyncPeriod"},
}

// unsupportedFlags are upstream flags this kube-proxy rejects, with what to
// do instead.
var unsupportedFlags = []struct{ flag, instead string }{
	{"windows-service", "it is a Windows-only flag and this kube-proxy runs on Linux only (use a systemd unit)"},
}

// portFlag is one of upstream's deprecated port flags and the address it
// completes.
type portFlag struct {
	flag     string // the port flag
	addrFlag string // the flag of the address it completes
	field    string // the configuration field of that address
	def      int32  // the port's default, upstream's
	usage    string
}

// portFlags are upstream's deprecated --healthz-port and --metrics-port,
// accepted as upstream accepts them: 0 empties the address (which turns the
// health server off, and which validation refuses for the metrics server, as
// upstream's does); any other port completes an address given as a bare IP by
// --healthz-bind-address or --metrics-bind-address, and an address that names
// its own port keeps it (upstream ignores the flag then; here a warning says
// so). Upstream reads them only without --config; here, like every flag, they
// apply with it too.
var portFlags = []portFlag{
	{"healthz-port", "healthz-bind-address", "healthzBindAddress", DefaultHealthzPort,
		"The port of the health check server when --healthz-bind-address is a bare IP; 0 turns the server off."},
	{"metrics-port", "metrics-bind-address", "metricsBindAddress", DefaultMetricsPort,
		"The port of the metrics server when --metrics-bind-address is a bare IP (0 is refused, as upstream)."},
}

// AddFlags registers kube-proxy's flags on fs under upstream's names. It does
// not register --v and --vmodule: main adds those two of klog's flags to fs,
// and Complete reads them from fs to fill logging.verbosity and
// logging.vmodule.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	if o.flags == nil {
		o.flags = Default()
	}
	f := o.flags

	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "The path to the configuration file (a KubeProxyConfiguration, apiVersion "+APIVersion+"). Flags given explicitly override its values.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", o.WriteConfigTo, "If set, write the effective configuration (defaults, file and flags) to this file and exit.")
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "If true, remove the iptables, nftables and IPVS rules kube-proxy created (in any mode), then exit.")
	fs.BoolVar(&o.InitOnly, "init-only", o.InitOnly, "If true, do the setup that needs full root privileges (sysctls), then exit; kube-proxy can then run with only CAP_NET_ADMIN.")
	fs.Var(&o.Version, "version", "--version, --version=raw print version information and exit; --version=vX.Y.Z... sets the Kubernetes version reported (same major, minor and patch).")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.StringVar(&o.Master, "master", o.Master, "The address of the Kubernetes API server; overrides the server in the kubeconfig.")

	fs.Var(&gatesValue{m: &f.FeatureGates}, "feature-gates", "Comma-separated key=true|false pairs enabling or disabling feature gates; merged over the config file's featureGates.")

	fs.StringVar(&f.ClientConnection.Kubeconfig, "kubeconfig", f.ClientConnection.Kubeconfig, "Path to a kubeconfig file with the API server location and credentials (--master overrides the server).")
	fs.StringVar(&f.ClientConnection.ContentType, "kube-api-content-type", f.ClientConnection.ContentType, "Content type of requests sent to the API server.")
	fs.Float32Var(&f.ClientConnection.QPS, "kube-api-qps", f.ClientConnection.QPS, "Queries per second allowed towards the API server.")
	fs.Int32Var(&f.ClientConnection.Burst, "kube-api-burst", f.ClientConnection.Burst, "Burst of queries allowed towards the API server.")

	fs.StringVar(&f.Logging.Format, "logging-format", f.Logging.Format, `Log format: "text" or "json".`)
	fs.DurationVar(&f.Logging.FlushFrequency.Duration.Duration, "log-flush-frequency", f.Logging.FlushFrequency.Duration.Duration, "Longest time between log flushes.")
	fs.BoolVar(&f.Logging.Options.Text.SplitStream, "log-text-split-stream", false, "[Alpha] Text format: errors to stderr, info to stdout (needs the LoggingAlphaOptions feature gate).")
	fs.Var(&f.Logging.Options.Text.InfoBufferSize, "log-text-info-buffer-size", "[Alpha] Text format with split streams: buffer size of info output, e.g. 64Ki (needs LoggingAlphaOptions).")
	fs.BoolVar(&f.Logging.Options.JSON.SplitStream, "log-json-split-stream", false, "[Alpha] JSON format: errors to stderr, info to stdout (needs the LoggingAlphaOptions feature gate).")
	fs.Var(&f.Logging.Options.JSON.InfoBufferSize, "log-json-info-buffer-size", "[Alpha] JSON format with split streams: buffer size of info output, e.g. 64Ki (needs LoggingAlphaOptions).")

	fs.StringVar(&o.hostname, "hostname-override", o.hostname, "If non-empty, the name of this node's Node object; otherwise the hostname is used. Overrides hostnameOverride in the config file.")
	fs.StringVar(&f.BindAddress, "bind-address", f.BindAddress, "The node's primary IP as far as kube-proxy is concerned (no socket is bound to it).")
	fs.StringVar(&f.HealthzBindAddress, "healthz-bind-address", f.HealthzBindAddress, "IP:port of the health check server (port 10256 if only an IP is given).")
	fs.StringVar(&f.MetricsBindAddress, "metrics-bind-address", f.MetricsBindAddress, "IP:port of the metrics server (port 10249 if only an IP is given); 0.0.0.0:10249 listens on all interfaces.")
	fs.BoolVar(&f.BindAddressHardFail, "bind-address-hard-fail", f.BindAddressHardFail, "If true, failing to listen on the health or metrics port is fatal.")
	fs.BoolVar(&f.EnableProfiling, "profiling", f.EnableProfiling, "If true, serve /debug/pprof on the metrics server.")
	fs.StringVar(&f.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", f.ShowHiddenMetricsForVersion, "The previous minor version ("+previousMinor()+") to show the metrics hidden in it.")

	fs.StringVar((*string)(&f.Mode), "proxy-mode", string(f.Mode), "Proxy mode: "+modeList()+".")
	fs.Int32Var(f.IPTables.MasqueradeBit, "iptables-masquerade-bit", *f.IPTables.MasqueradeBit, "The fwmark bit (0..31) marking packets to SNAT, in iptables and ipvs mode.")
	fs.BoolVar(&f.IPTables.MasqueradeAll, "masquerade-all", f.IPTables.MasqueradeAll, "SNAT all traffic sent to Service cluster IPs (some CNI plugins need it).")
	fs.BoolVar(f.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *f.IPTables.LocalhostNodePorts, "If false, NodePorts do not answer on 127.0.0.0/8 (iptables mode, IPv4).")
	fs.DurationVar(&f.IPTables.SyncPeriod.Duration, "iptables-sync-period", f.IPTables.SyncPeriod.Duration, "Interval of full resyncs in iptables mode (e.g. 30s, 1m). Must be greater than 0.")
	fs.DurationVar(&f.IPTables.MinSyncPeriod.Duration, "iptables-min-sync-period", f.IPTables.MinSyncPeriod.Duration, "Least time between two iptables syncs; 0 syncs on every Service or EndpointSlice change.")
	fs.DurationVar(&f.IPVS.SyncPeriod.Duration, "ipvs-sync-period", f.IPVS.SyncPeriod.Duration, "Interval of full resyncs in ipvs mode (e.g. 30s, 1m). Must be greater than 0.")
	fs.DurationVar(&f.IPVS.MinSyncPeriod.Duration, "ipvs-min-sync-period", f.IPVS.MinSyncPeriod.Duration, "Least time between two IPVS syncs; 0 syncs on every Service or EndpointSlice change.")
	fs.StringVar(&f.IPVS.Scheduler, "ipvs-scheduler", f.IPVS.Scheduler, "IPVS scheduler in ipvs mode: "+strings.Join(ipvsSchedulers, ", ")+".")
	fs.StringSliceVar(&f.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", f.IPVS.ExcludeCIDRs, "Comma-separated CIDRs whose IPVS services kube-proxy leaves alone when cleaning up.")
	fs.BoolVar(&f.IPVS.StrictARP, "ipvs-strict-arp", f.IPVS.StrictARP, "Set arp_ignore=1 and arp_announce=2 in ipvs mode.")
	fs.DurationVar(&f.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", f.IPVS.TCPTimeout.Duration, "IPVS idle TCP timeout; 0 keeps the kernel's.")
	fs.DurationVar(&f.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", f.IPVS.TCPFinTimeout.Duration, "IPVS TCP timeout after a FIN; 0 keeps the kernel's.")
	fs.DurationVar(&f.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", f.IPVS.UDPTimeout.Duration, "IPVS UDP timeout; 0 keeps the kernel's.")

	fs.StringVar((*string)(&f.DetectLocalMode), "detect-local-mode", string(f.DetectLocalMode), "How local pod traffic is recognised: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.")
	fs.StringVar(&f.DetectLocal.BridgeInterface, "pod-bridge-interface", f.DetectLocal.BridgeInterface, "With --detect-local-mode=BridgeInterface: the bridge local pods are attached to.")
	fs.StringVar(&f.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", f.DetectLocal.InterfaceNamePrefix, "With --detect-local-mode=InterfaceNamePrefix: the name prefix of local pods' interfaces.")
	fs.StringVar(&f.ClusterCIDR, "cluster-cidr", f.ClusterCIDR, "The pods' CIDR, or a comma-separated dual-stack pair; used with --detect-local-mode=ClusterCIDR.")
	fs.StringSliceVar(&f.NodePortAddresses, "nodeport-addresses", f.NodePortAddresses, "Comma-separated CIDRs and keywords (primary, localhost, all) of the node IPs NodePorts answer on; empty means all.")

	fs.Int32Var(f.OOMScoreAdj, "oom-score-adj", *f.OOMScoreAdj, "The oom_score_adj of the kube-proxy process, within [-1000, 1000].")
	fs.Int32Var(f.Conntrack.MaxPerCore, "conntrack-max-per-core", *f.Conntrack.MaxPerCore, "Conntrack entries per CPU core (0 leaves the limit and --conntrack-min alone).")
	fs.Int32Var(f.Conntrack.Min, "conntrack-min", *f.Conntrack.Min, "Least conntrack entries, whatever --conntrack-max-per-core gives.")
	fs.DurationVar(&f.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", f.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout of established TCP connections (0 leaves it).")
	fs.DurationVar(&f.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", f.Conntrack.TCPCloseWaitTimeout.Duration, "Timeout of TCP connections in CLOSE_WAIT (0 leaves it).")
	fs.BoolVar(&f.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", f.Conntrack.TCPBeLiberal, "Set nf_conntrack_tcp_be_liberal=1 (out-of-window TCP packets are not marked INVALID).")
	fs.DurationVar(&f.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", f.Conntrack.UDPTimeout.Duration, "Idle timeout of UNREPLIED UDP conntrack entries (0 leaves it).")
	fs.DurationVar(&f.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", f.Conntrack.UDPStreamTimeout.Duration, "Idle timeout of ASSURED UDP conntrack entries (0 leaves it).")
	fs.DurationVar(&f.ConfigSyncPeriod.Duration, "config-sync-period", f.ConfigSyncPeriod.Duration, "How often the watch of this Node resyncs from the API server (Services and EndpointSlices need none). Must be greater than 0.")

	o.ports = map[string]*int32{}
	for _, p := range portFlags {
		port := p.def
		o.ports[p.flag] = &port
		fs.Int32Var(&port, p.flag, port, p.usage)
		_ = fs.MarkDeprecated(p.flag, "use --"+p.addrFlag+"=IP:PORT instead")
	}
	for _, u := range unsupportedFlags {
		fs.Var(&rejectValue{flag: u.flag, instead: u.instead}, u.flag, "Not supported: "+u.instead)
		// With a NoOptDefVal every use, with or without a value, reaches Set
		// and gets the explanation rather than pflag's generic message.
		fs.Lookup(u.flag).NoOptDefVal = "set"
		_ = fs.MarkHidden(u.flag)
	}
}

// Overrides returns the configuration fields (JSON paths) that flags given
// explicitly on fs override, in the order of the table above, then those a
// deprecated port flag changes.
func (o *Options) Overrides(fs *pflag.FlagSet) []string {
	var out []string
	for _, ff := range fieldFlags {
		if !changed(fs, ff.flag) {
			continue
		}
		if ff.flag == "hostname-override" && o.hostname == "" {
			continue
		}
		out = append(out, ff.field)
	}
	for _, p := range portFlags {
		if _, applies := o.portAddress(fs, p); applies && !slices.Contains(out, p.field) {
			out = append(out, p.field)
		}
	}
	return out
}

// ModeDefaulted reports whether the mode of the configuration Complete builds
// is the default, iptables, because neither --proxy-mode nor the file names
// one (or they name ""): upstream kube-proxy then warns, in its log and with a
// KubeProxyDefaultMode event, that the default becomes nftables in Kubernetes
// 1.40. It reads the file again; a file Complete could not load gives false.
func (o *Options) ModeDefaulted(fs *pflag.FlagSet) bool {
	if changed(fs, "proxy-mode") {
		return o.flags.Mode == ""
	}
	if o.ConfigFile == "" {
		return true
	}
	data, err := os.ReadFile(o.ConfigFile)
	if err != nil {
		return false
	}
	root, err := yamlToJSONValue(data)
	if err != nil {
		return false
	}
	top, ok := root.(map[string]any)
	if !ok {
		return false
	}
	mode, _ := top["mode"].(string)
	return mode == ""
}

// portAddress returns the address a deprecated port flag makes of its
// server's address, as upstream does: none (the server is off) for port 0,
// or the bare IP given by the address flag with the port appended. applies is
// false when the flag is not given, or when the address has a port of its
// own, which the port flag does not change.
func (o *Options) portAddress(fs *pflag.FlagSet, p portFlag) (addr string, applies bool) {
	if !changed(fs, p.flag) {
		return "", false
	}
	port := *o.ports[p.flag]
	if port == 0 {
		return "", true
	}
	if !changed(fs, p.addrFlag) {
		return "", false
	}
	raw := fieldByPath(reflect.ValueOf(o.flags).Elem(), p.field).String()
	if _, _, err := net.SplitHostPort(raw); err == nil || parseIP(raw) == nil {
		return "", false
	}
	return appendPortIfNeeded(raw, int(port)), true
}

func changed(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}

// Complete builds the effective configuration: the file named by --config
// (decoded strictly and defaulted) or the defaults, then every flag given
// explicitly on fs copied over it, then validation. Flag values are applied
// after defaulting, so an explicit zero such as --iptables-min-sync-period=0
// is kept. Problems come as one error joining *FieldError values; those of
// fields set by a flag name the flag instead of a file line. The warnings are
// about settings that load but do nothing or will stop working (fields older
// releases had, GA or deprecated feature gates), in the same form; the caller
// logs them.
//
// Complete does not change o and may be called again, for example on SIGHUP.
func (o *Options) Complete(fs *pflag.FlagSet) (*KubeProxyConfiguration, []*FieldError, error) {
	var (
		c     *KubeProxyConfiguration
		lines lineIndex
		warns []*FieldError
	)
	if o.ConfigFile != "" {
		data, err := os.ReadFile(o.ConfigFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading kube-proxy config: %w", err)
		}
		var errs []*FieldError
		c, lines, errs, warns = decode(o.ConfigFile, data)
		if len(errs) > 0 {
			return nil, nil, joinFieldErrors(errs)
		}
	} else {
		c = Default()
	}

	bySet, errs, flagWarns := o.applyFlags(fs, c)
	warns = append(warns, flagWarns...)
	c.applyPlatformDefaults()
	if len(errs) == 0 {
		var more []*FieldError
		errs, more = c.validate()
		for _, e := range append(errs, more...) {
			if flag := flagFor(bySet, e.Field); flag != "" {
				e.Msg += " (set by --" + flag + ")"
				continue
			}
			if o.ConfigFile != "" {
				e.File = o.ConfigFile
				e.Line = lines.lineFor(e.Field)
			}
		}
		warns = append(warns, more...)
	}
	if len(errs) > 0 {
		return nil, nil, joinFieldErrors(errs)
	}
	return c, warns, nil
}

// flagFor returns the flag that set field or one of its ancestors.
func flagFor(bySet map[string]string, field string) string {
	for p := field; p != ""; p = parentPath(p) {
		if f, ok := bySet[p]; ok {
			return f
		}
	}
	return ""
}

// applyFlags copies the explicitly given config-field flags into c and
// returns which field each came from, the errors, and warnings about
// deprecated flags that change nothing.
func (o *Options) applyFlags(fs *pflag.FlagSet, c *KubeProxyConfiguration) (map[string]string, []*FieldError, []*FieldError) {
	if o.flags == nil {
		o.flags = Default()
	}
	bySet := map[string]string{}
	var errs []*FieldError
	fail := func(ff fieldFlag, format string, args ...any) {
		errs = append(errs, &FieldError{Field: ff.field, Msg: fmt.Sprintf(format, args...) + " (set by --" + ff.flag + ")"})
	}
	for _, ff := range fieldFlags {
		if !changed(fs, ff.flag) {
			continue
		}
		switch ff.flag {
		case "hostname-override":
			if o.hostname == "" {
				continue // upstream ignores an empty override
			}
			h := strings.TrimSpace(o.hostname)
			if h == "" {
				fail(ff, "must not be blank")
				continue
			}
			c.HostnameOverride = strings.ToLower(h)
		case "feature-gates":
			if c.FeatureGates == nil {
				c.FeatureGates = map[string]bool{}
			}
			for k, v := range o.flags.FeatureGates {
				c.FeatureGates[k] = v
				// Per gate, so that a problem of a gate the file set names the file.
				bySet[joinPath(ff.field, k)] = ff.flag
			}
			continue
		case "v":
			lvl, err := strconv.ParseUint(fs.Lookup("v").Value.String(), 10, 32)
			if err != nil {
				fail(ff, "%q is not a verbosity level", fs.Lookup("v").Value.String())
				continue
			}
			c.Logging.Verbosity = VerbosityLevel(lvl)
		case "vmodule":
			items, err := parseVModule(fs.Lookup("vmodule").Value.String())
			if err != nil {
				fail(ff, "%v", err)
				continue
			}
			c.Logging.VModule = append(items, c.Logging.VModule...)
		case "healthz-bind-address":
			c.HealthzBindAddress = appendPortIfNeeded(o.flags.HealthzBindAddress, DefaultHealthzPort)
		case "metrics-bind-address":
			c.MetricsBindAddress = appendPortIfNeeded(o.flags.MetricsBindAddress, DefaultMetricsPort)
		case "log-flush-frequency":
			c.Logging.FlushFrequency = TimeOrMetaDuration{Duration: o.flags.Logging.FlushFrequency.Duration, SerializeAsString: true}
		default:
			dst, src := fieldByPath(reflect.ValueOf(c).Elem(), ff.field), fieldByPath(reflect.ValueOf(o.flags).Elem(), ff.field)
			dst.Set(cloneValue(src))
		}
		bySet[ff.field] = ff.flag
	}
	if c.Mode == ModeNFTables {
		// Upstream's iptables flags set the generic sync periods and masqueradeAll, which mode nftables
		// reads from its own section.
		for _, m := range nftablesFlags {
			if changed(fs, m.flag) {
				dst, src := fieldByPath(reflect.ValueOf(c).Elem(), m.to), fieldByPath(reflect.ValueOf(o.flags).Elem(), m.from)
				dst.Set(cloneValue(src))
				bySet[m.to] = m.flag
			}
		}
	}
	var warns []*FieldError
	for _, p := range portFlags {
		if !changed(fs, p.flag) {
			continue
		}
		dst := fieldByPath(reflect.ValueOf(c).Elem(), p.field)
		addr, applies := o.portAddress(fs, p)
		if !applies {
			host, _, _ := net.SplitHostPort(dst.String())
			warns = append(warns, &FieldError{Field: p.field, Msg: fmt.Sprintf(
				"--%s=%d changes nothing, as upstream: the address %q has a port of its own; use --%s=%s",
				p.flag, *o.ports[p.flag], dst.String(), p.addrFlag, net.JoinHostPort(host, strconv.Itoa(int(*o.ports[p.flag]))))})
			continue
		}
		dst.SetString(addr)
		bySet[p.field] = p.flag
	}
	return bySet, errs, warns
}

// nftablesFlags are the flags that, as upstream's, also set the nftables section in mode nftables.
var nftablesFlags = []struct{ flag, from, to string }{
	{"iptables-sync-period", "iptables.syncPeriod", "nftables.syncPeriod"},
	{"iptables-min-sync-period", "iptables.minSyncPeriod", "nftables.minSyncPeriod"},
	{"masquerade-all", "iptables.masqueradeAll", "nftables.masqueradeAll"},
}

// parseVModule parses klog's "pattern=N,pattern=N" syntax.
func parseVModule(s string) (VModuleConfiguration, error) {
	var out VModuleConfiguration
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		pat, lvl, ok := strings.Cut(part, "=")
		n, err := strconv.ParseUint(lvl, 10, 32)
		if !ok || pat == "" || err != nil {
			return nil, fmt.Errorf("%q is not pattern=N", part)
		}
		out = append(out, VModuleItem{FilePattern: pat, Verbosity: VerbosityLevel(n)})
	}
	return out, nil
}

// fieldByPath returns the field of struct value v at a dotted JSON path.
func fieldByPath(v reflect.Value, path string) reflect.Value {
	for _, name := range strings.Split(path, ".") {
		for v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		f, ok := findField(jsonFields(v.Type()), name)
		if !ok {
			panic(fmt.Sprintf("config: no field %q in %s", path, v.Type()))
		}
		v = v.FieldByIndex(f.index)
	}
	return v
}

// gatesValue is the pflag.Value of --feature-gates: key=bool pairs, merged
// into the map across repeated uses.
type gatesValue struct{ m *map[string]bool }

func (g *gatesValue) String() string {
	if g.m == nil || len(*g.m) == 0 {
		return ""
	}
	var parts []string
	for k, v := range *g.m {
		parts = append(parts, k+"="+strconv.FormatBool(v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (g *gatesValue) Set(s string) error {
	if *g.m == nil {
		*g.m = map[string]bool{}
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return fmt.Errorf("%q is not a key=true|false pair", part)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("feature gate %s: %q is not true or false", k, v)
		}
		(*g.m)[k] = b
	}
	return nil
}

func (g *gatesValue) Type() string { return "mapStringBool" }

// modeList names the modes --proxy-mode takes, the default first.
func modeList() string {
	names := []string{string(ModeIPTables) + " (the default)"}
	for _, m := range supportedModes {
		if m != ModeIPTables {
			names = append(names, string(m))
		}
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// rejectValue is the pflag.Value of an unsupported flag: any use fails.
type rejectValue struct{ flag, instead string }

func (r *rejectValue) String() string { return "" }
func (r *rejectValue) Set(string) error {
	return fmt.Errorf("--%s is not supported by this kube-proxy: %s", r.flag, r.instead)
}
func (r *rejectValue) Type() string { return "unsupported" }
