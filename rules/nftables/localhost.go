package nftables

import (
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
)

// localhostPolicy is the engine key's Policy of a localhost NodePort listener.
const localhostPolicy = "localhost-nodeport"

// localhostProxy serves TCP NodePorts on the family's loopback address with the userspace proxy engine,
// as upstream's alpha (KEP-6032) does with the KubeProxyNFTablesLocalhostNodePorts gate on and loopback
// listed in nodePortAddresses: the table neither DNATs nor rejects that traffic, so it reaches a listener
// on 127.0.0.1:<nodePort> (::1). The endpoints are the cluster selection, or the local one under
// externalTrafficPolicy Local, as upstream picks them.
type localhostProxy struct {
	e *engine.Engine
	m localhostMetrics
	// reported is set once the listener gauge was set: as upstream's, it has no value until the proxy
	// first runs, and is 0 once the proxy stops.
	reported bool
}

func newLocalhostProxy(family v1.IPFamily, m localhostMetrics) *localhostProxy {
	addr := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if family == v1.IPv6Protocol {
		addr = netip.IPv6Loopback()
	}
	return &localhostProxy{e: engine.New(family, addr, engine.Options{}, m.engine), m: m}
}

// sync opens, updates and closes the listeners for snap; with on false it closes them all. It reports
// the listeners open and counts those that could not be opened (the port taken, the descriptors used up).
func (p *localhostProxy) sync(snap *proxy.Snapshot, on bool) {
	want := map[engine.Key]bool{}
	if on {
		for _, sp := range snap.Sorted() {
			if sp.Protocol != v1.ProtocolTCP || sp.NodePort == 0 {
				continue
			}
			eps := sp.ClusterEndpoints
			if sp.ExternalPolicyLocal {
				eps = sp.LocalEndpoints
			}
			if len(eps) == 0 {
				continue // nothing listens: connections are refused, as with no endpoints elsewhere
			}
			t := engine.Target{Affinity: time.Duration(sp.StickyMaxAgeSeconds) * time.Second}
			for _, ep := range eps {
				t.Endpoints = append(t.Endpoints, ep.AddrPort())
			}
			key := engine.Key{Name: sp.Name.String(), Protocol: v1.ProtocolTCP, Policy: localhostPolicy}
			if _, err := p.e.EnsureAt(key, uint16(sp.NodePort), t); err != nil {
				// Only opening a listener fails (an open one just takes the new endpoints).
				klog.ErrorS(err, "Could not serve a NodePort on localhost", "service", key.Name, "nodePort", sp.NodePort, "ipFamily", snap.Family)
				p.m.failures.WithLabelValues(p.m.family).Inc()
				continue
			}
			want[key] = true
		}
	}
	for _, k := range p.e.Keys() {
		if !want[k] {
			p.e.Remove(k)
		}
	}
	if on || p.reported {
		p.m.listeners.WithLabelValues(p.m.family).Set(float64(len(want)))
		p.reported = true
	}
}

// hasLoopback reports whether a family's nodePortAddresses list a loopback CIDR explicitly.
func hasLoopback(n proxy.NodePortAddresses) bool {
	return slices.ContainsFunc(n.CIDRs, func(p netip.Prefix) bool { return p.Masked().Addr().IsLoopback() })
}
