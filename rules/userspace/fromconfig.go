package userspace

import (
	"reflect"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
)

// ConfigFrom derives the rules configuration of one family from a validated configuration.
func ConfigFrom(c *config.KubeProxyConfiguration, family v1.IPFamily) (Config, error) {
	s, err := proxy.SettingsFor(c, family)
	if err != nil {
		return Config{}, err
	}
	return Config{Settings: s}, nil
}

// EngineOptions derives the proxy engine's options: udpIdleTimeout (250 ms when unset, as upstream's
// userspace mode had it), and conntrack.tcpEstablishedTimeout as the TCP idle timeout, so that a
// connection lasts here as long as the kernel would keep it in the other modes.
func EngineOptions(c *config.KubeProxyConfiguration) engine.Options {
	var o engine.Options
	o.UDPIdleTimeout = c.UDPIdleTimeout.Duration
	if d := c.Conntrack.TCPEstablishedTimeout; d != nil {
		o.IdleTimeout = d.Duration
	}
	return o
}

// Reconfigure takes a reloaded configuration: a change to the rules' settings makes the next sync full.
// The engine's options are fixed at start; a change to them is logged and waits for a restart.
func (d *Dataplane) Reconfigure(c *config.KubeProxyConfiguration) error {
	cfg, err := ConfigFrom(c, d.family)
	if err != nil {
		return err
	}
	if o := EngineOptions(c); o.UDPIdleTimeout != 0 && o.UDPIdleTimeout != d.engine.Options().UDPIdleTimeout ||
		o.IdleTimeout != d.engine.Options().IdleTimeout {
		klog.InfoS("Userspace proxy timeouts changed; they take effect at the next restart", "ipFamily", d.family)
	}
	d.mu.Lock()
	same := reflect.DeepEqual(cfg, d.cfg)
	d.mu.Unlock()
	if !same {
		d.SetConfig(cfg)
	}
	return nil
}
