package iptables

import (
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/sysctl"
)

// sysctlTCPBeLiberal is the kernel's switch that makes conntrack accept out-of-window TCP packets.
const sysctlTCPBeLiberal = "net/netfilter/nf_conntrack_tcp_be_liberal"

// ConfigFrom derives the renderer configuration of one IP family from the (validated) configuration file
// and the kernel: like upstream, the DROP of ctstate INVALID packets is left out whenever
// nf_conntrack_tcp_be_liberal is on, whether conntrack.tcpBeLiberal set it or something else did (read
// at start and on every reload).
func ConfigFrom(c *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	s, err := proxy.SettingsFor(c, family)
	if err != nil {
		return Config{}, err
	}
	liberal := c.Conntrack.TCPBeLiberal
	if v, err := sysctl.Get(sysctlTCPBeLiberal); err == nil && v != 0 {
		liberal = true
	}
	return Config{Settings: s, TCPBeLiberal: liberal}, nil
}
