package userspace

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
)

// Destination is one UDP address a Service port answers on and the listener ports its traffic may be
// redirected to now. For NodePorts Addr is invalid: any local address.
type Destination struct {
	Addr  netip.Addr
	Port  uint16
	Ports []uint16
}

// Destinations lists the UDP destinations of snap with their current listener ports.
func Destinations(snap *proxy.Snapshot, ports map[engine.Key]uint16) []Destination {
	var out []Destination
	for _, sp := range snap.Services {
		if sp.Protocol != v1.ProtocolUDP {
			continue
		}
		var allowed []uint16
		for _, p := range []string{PolicyCluster, PolicyLocal} {
			if port := ports[KeyOf(sp, p)]; port != 0 {
				allowed = append(allowed, port)
			}
		}
		add := func(a netip.Addr, port int32) {
			out = append(out, Destination{Addr: a, Port: uint16(port), Ports: allowed})
		}
		if sp.ClusterIP.IsValid() {
			add(sp.ClusterIP, sp.Port)
		}
		for _, ip := range sp.ExternalIPs {
			add(ip, sp.Port)
		}
		for _, ip := range sp.LoadBalancerIPs {
			add(ip, sp.Port)
		}
		if sp.NodePort != 0 {
			add(netip.Addr{}, sp.NodePort)
		}
	}
	return out
}

// Stale reports whether a UDP conntrack entry (original destination, reply source) is one of our
// redirects that no longer goes to a current listener of its destination.
func Stale(dsts []Destination, origDst, replySrc netip.AddrPort) bool {
	if origDst == replySrc {
		return false // not redirected
	}
	for _, d := range dsts {
		if d.Port != origDst.Port() || (d.Addr.IsValid() && d.Addr != origDst.Addr()) {
			continue
		}
		for _, p := range d.Ports {
			if p == replySrc.Port() {
				return false
			}
		}
		return true
	}
	return false
}
