package iptables

import (
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// ConfigFrom derives the renderer configuration of one IP family from the (validated) configuration file.
func ConfigFrom(c *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	s, err := proxy.SettingsFor(c, family)
	if err != nil {
		return Config{}, err
	}
	return Config{Settings: s, TCPBeLiberal: c.Conntrack.TCPBeLiberal}, nil
}
