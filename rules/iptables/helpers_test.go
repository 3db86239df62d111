package iptables

import (
	"net/netip"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
)

// generation numbers hand-built snapshots so that Snapshot.Changes compares them by content.
var generation atomic.Uint64

const testNode = "node-a"

// port builds a Service port; opts adjust it before endpoints are selected by snap.
func port(nsName string, portName string, proto v1.Protocol, clusterIP string, p int32, opts ...func(*proxy.ServicePort)) *proxy.ServicePort {
	ns, name, _ := strings.Cut(nsName, "/")
	sp := &proxy.ServicePort{
		Name: proxy.ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: name},
			Port:           portName,
			Protocol:       proto,
		},
		ClusterIP: netip.MustParseAddr(clusterIP),
		Port:      p,
		Protocol:  proto,
	}
	for _, o := range opts {
		o(sp)
	}
	return sp
}

// eps adds endpoints given as "ip:port" with optional flags after a comma: local, notready, terminating,
// notserving (e.g. "10.0.0.1:80,local,terminating,notready").
func eps(list ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range list {
			parts := strings.Split(s, ",")
			ap := netip.MustParseAddrPort(parts[0])
			e := proxy.NewEndpoint(ap.Addr(), int32(ap.Port()))
			e.Ready, e.Serving = true, true
			e.NodeName = "node-b"
			for _, f := range parts[1:] {
				switch f {
				case "local":
					e.IsLocal, e.NodeName = true, testNode
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
	}
}

func nodePort(n int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.NodePort = n }
}

func externalIPs(ips ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(s))
		}
	}
}

func lbIPs(ips ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(s))
		}
	}
}

func sourceRanges(cidrs ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		for _, s := range cidrs {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

func affinity(seconds int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.StickyMaxAgeSeconds = seconds }
}

// etpLocal sets externalTrafficPolicy Local (and a health check node port when hc is not 0).
func etpLocal(hc int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, hc }
}

func itpLocal(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true }

// snapshot builds a snapshot of the given family, selecting endpoints as the proxy package does.
func snapshot(family v1.IPFamily, node proxy.Node, ports ...*proxy.ServicePort) *proxy.Snapshot {
	if node.Name == "" {
		node.Name = testNode
	}
	s := &proxy.Snapshot{
		Family:     family,
		Generation: generation.Add(1),
		Node:       node,
		Services:   map[proxy.ServicePortName]*proxy.ServicePort{},
	}
	for _, sp := range ports {
		sel := proxy.SelectEndpoints(sp, sp.Endpoints, node.Name, node.Zone)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = sel.Cluster, sel.Local, sel.HasAny
		s.Services[sp.Name] = sp
	}
	return s
}

// derive returns a new snapshot equal to base with ports replaced or added, and names removed.
func derive(base *proxy.Snapshot, remove []proxy.ServicePortName, ports ...*proxy.ServicePort) *proxy.Snapshot {
	s := &proxy.Snapshot{
		Family:     base.Family,
		Generation: generation.Add(1),
		Node:       base.Node,
		Services:   map[proxy.ServicePortName]*proxy.ServicePort{},
	}
	for k, v := range base.Services {
		s.Services[k] = v
	}
	for _, n := range remove {
		delete(s.Services, n)
	}
	for _, sp := range ports {
		sel := proxy.SelectEndpoints(sp, sp.Endpoints, s.Node.Name, s.Node.Zone)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = sel.Cluster, sel.Local, sel.HasAny
		s.Services[sp.Name] = sp
	}
	return s
}

func v4Node(ips ...string) proxy.Node {
	n := proxy.Node{Name: testNode, Known: true}
	for _, s := range ips {
		n.IPs = append(n.IPs, netip.MustParseAddr(s))
	}
	return n
}

func prefixes(list ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range list {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// seed000 is the seed 000 case.
func seed000() *proxy.Snapshot {
	return snapshot(v1.IPv4Protocol, v4Node("10.0.0.1"),
		port("default/clusterip-service", "", v1.ProtocolTCP, "10.100.100.100", 80,
			eps("192.168.11.73:80", "192.168.11.74:80", "192.168.221.10:80")))
}

type netipAddr = netip.Addr

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
