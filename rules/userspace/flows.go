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
	// Opened says that a listener of the destination opened in this sync: until then its packets were
	// not redirected (the Service or its endpoints did not exist), so a flow the kernel still tracks
	// without a redirect began before the listener and would never reach it.
	Opened bool
}

// Destinations lists the UDP destinations of snap with their current listener ports; opened says which
// listeners opened in this sync.
func Destinations(snap *proxy.Snapshot, ports map[engine.Key]uint16, opened func(engine.Key) bool) []Destination {
	var out []Destination
	for _, sp := range snap.Services {
		if sp.Protocol != v1.ProtocolUDP {
			continue
		}
		var allowed []uint16
		var isNew bool
		for _, p := range []string{PolicyCluster, PolicyLocal} {
			k := KeyOf(sp, p)
			if port := ports[k]; port != 0 {
				allowed = append(allowed, port)
				isNew = isNew || opened(k)
			}
		}
		add := func(a netip.Addr, port int32) {
			out = append(out, Destination{Addr: a, Port: uint16(port), Ports: allowed, Opened: isNew})
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

// Stale reports whether a UDP conntrack entry (original destination, reply source) of a destination
// keeps its packets from the destination's current listener: one of our redirects to a listener port that
// is no longer the destination's, or a flow that was never redirected because it began before the
// destination's listener opened (in this sync).
func Stale(dsts []Destination, origDst, replySrc netip.AddrPort) bool {
	for _, d := range dsts {
		if d.Port != origDst.Port() || (d.Addr.IsValid() && d.Addr != origDst.Addr()) {
			continue
		}
		if origDst == replySrc { // not redirected
			return d.Opened
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
