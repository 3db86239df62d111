// Package proxytest builds proxy snapshots by hand, for the dataplanes' tests: Service ports with their
// endpoints, and snapshots whose endpoint selection is done by proxy.SelectEndpoints as the daemon does.
package proxytest

import (
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
)

// NodeName is the name of the node the snapshots are for; endpoints marked local run there.
const NodeName = "node-a"

// generation numbers hand-built snapshots so that Snapshot.Changes compares them by content.
var generation atomic.Uint64

// Option adjusts a Service port.
type Option = func(*proxy.ServicePort)

// Port builds a Service port "ns/name", named portName (may be empty); opts adjust it.
func Port(nsName, portName string, proto v1.Protocol, clusterIP string, port int32, opts ...Option) *proxy.ServicePort {
	ns, name, _ := strings.Cut(nsName, "/")
	sp := &proxy.ServicePort{
		Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name},
			Port: portName, Protocol: proto},
		ClusterIP: netip.MustParseAddr(clusterIP),
		Port:      port,
		Protocol:  proto,
	}
	for _, o := range opts {
		o(sp)
	}
	return sp
}

// Endpoints adds endpoints written "ip:port" with optional flags after commas: local, notready,
// terminating, notserving (e.g. "10.0.0.1:80,local,terminating"). Others run on node-b. The port's
// endpoints stay sorted by address, as in real snapshots.
func Endpoints(list ...string) Option {
	return func(sp *proxy.ServicePort) {
		for _, s := range list {
			parts := strings.Split(s, ",")
			ap := netip.MustParseAddrPort(parts[0])
			e := proxy.NewEndpoint(ap.Addr(), int32(ap.Port()))
			e.Ready, e.Serving, e.NodeName = true, true, "node-b"
			for _, f := range parts[1:] {
				switch f {
				case "local":
					e.IsLocal, e.NodeName = true, NodeName
				case "notready":
					e.Ready = false
				case "terminating":
					e.Terminating = true
				case "notserving":
					e.Serving = false
				default:
					panic("unknown endpoint flag " + f)
				}
			}
			sp.Endpoints = append(sp.Endpoints, e)
		}
		slices.SortFunc(sp.Endpoints, func(a, b proxy.Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
	}
}

// NodePort sets the node port.
func NodePort(n int32) Option { return func(sp *proxy.ServicePort) { sp.NodePort = n } }

// ExternalIPs adds external IPs.
func ExternalIPs(ips ...string) Option {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(s))
		}
	}
}

// LoadBalancerIPs adds load balancer ingress IPs.
func LoadBalancerIPs(ips ...string) Option {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(s))
		}
	}
}

// SourceRanges adds loadBalancerSourceRanges.
func SourceRanges(cidrs ...string) Option {
	return func(sp *proxy.ServicePort) {
		for _, s := range cidrs {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

// Affinity turns on ClientIP session affinity with a timeout.
func Affinity(seconds int32) Option {
	return func(sp *proxy.ServicePort) { sp.StickyMaxAgeSeconds = seconds }
}

// ExternalLocal sets externalTrafficPolicy Local, with a health check node port when hc is not 0.
func ExternalLocal(hc int32) Option {
	return func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, hc }
}

// InternalLocal sets internalTrafficPolicy Local.
func InternalLocal(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true }

// Node returns this node with the given addresses ("ip") and pod CIDRs ("cidr/len").
func Node(addrs ...string) proxy.Node {
	n := proxy.Node{Name: NodeName, Known: true}
	for _, s := range addrs {
		if strings.Contains(s, "/") {
			n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(s))
		} else {
			n.IPs = append(n.IPs, netip.MustParseAddr(s))
		}
	}
	return n
}

// Snapshot builds a snapshot of the ports, selecting endpoints as the proxy does.
func Snapshot(family v1.IPFamily, node proxy.Node, ports ...*proxy.ServicePort) *proxy.Snapshot {
	if node.Name == "" {
		node.Name = NodeName
	}
	s := &proxy.Snapshot{Family: family, Generation: generation.Add(1), Node: node,
		Services: map[proxy.ServicePortName]*proxy.ServicePort{}}
	add(s, ports)
	return s
}

// Derive returns a snapshot like base with the named ports removed and ports added or replaced.
func Derive(base *proxy.Snapshot, remove []proxy.ServicePortName, ports ...*proxy.ServicePort) *proxy.Snapshot {
	s := &proxy.Snapshot{Family: base.Family, Generation: generation.Add(1), Node: base.Node,
		Services: make(map[proxy.ServicePortName]*proxy.ServicePort, len(base.Services)+len(ports))}
	for k, v := range base.Services {
		s.Services[k] = v
	}
	for _, n := range remove {
		delete(s.Services, n)
	}
	add(s, ports)
	return s
}

func add(s *proxy.Snapshot, ports []*proxy.ServicePort) {
	for _, sp := range ports {
		sel := proxy.SelectEndpoints(sp, sp.Endpoints, s.Node.Name, s.Node.Zone)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = sel.Cluster, sel.Local, sel.HasAny
		s.Services[sp.Name] = sp
	}
}
