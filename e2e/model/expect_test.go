package model

import (
	"net"
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// This file computes, from the objects the test wrote, what kube-proxy should program. It is written from
// upstream kube-proxy's rules (pkg/proxy: service ports, the EndpointSlice cache, CategorizeEndpoints and
// topologyModeFromHints) and deliberately uses nothing from proxy/, so that the model under test cannot
// agree with itself by construction.

// labelServiceProxyName marks a Service that another proxy handles.
const labelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// objects is the API state the expectation is computed from: the objects as the API server returned them
// after the test's last write (so allocated cluster IPs and node ports are known).
type objects struct {
	nodeName string
	node     *v1.Node // nil when the Node does not exist
	services []*v1.Service
	slices   []*discovery.EndpointSlice
}

// expect returns the snapshot view the proxy of node o.nodeName should hold for family.
func expect(o *objects, family v1.IPFamily) familyView {
	fv := familyView{Ports: map[string]portView{}}
	zone := ""
	if o.node != nil {
		zone = o.node.Labels[v1.LabelTopologyZone]
		fv.Node = nodeView{Known: true, Zone: zone}
		for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
			for _, a := range o.node.Status.Addresses {
				if a.Type == typ && familyOf(a.Address) == family && !slices.Contains(fv.Node.IPs, a.Address) {
					fv.Node.IPs = append(fv.Node.IPs, a.Address)
				}
			}
		}
		for _, c := range o.node.Spec.PodCIDRs {
			if ip, _, err := net.ParseCIDR(c); err == nil && familyOf(ip.String()) == family {
				fv.Node.PodCIDRs = append(fv.Node.PodCIDRs, c)
			}
		}
	}

	for _, svc := range o.services {
		if !proxied(svc) {
			continue
		}
		clusterIP := ""
		for i, f := range svc.Spec.IPFamilies {
			if f == family && i < len(svc.Spec.ClusterIPs) {
				clusterIP = svc.Spec.ClusterIPs[i]
			}
		}
		if clusterIP == "" {
			continue
		}
		base := serviceLevel(svc, family)
		base.ClusterIP = clusterIP
		for _, p := range svc.Spec.Ports {
			pv := base
			pv.Port, pv.NodePort = p.Port, p.NodePort
			pv.Endpoints = endpointsOf(o, svc, family, p.Name, p.Protocol)
			choose(&pv, o.nodeName, zone)
			fv.Ports[portKey(svc.Namespace, svc.Name, p.Name, string(p.Protocol))] = pv
		}
	}
	return fv
}

// proxied reports whether kube-proxy handles svc at all: not headless, not ExternalName, not labelled for
// another proxy.
func proxied(svc *v1.Service) bool {
	if _, other := svc.Labels[labelServiceProxyName]; other {
		return false
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return false
	}
	return svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != v1.ClusterIPNone
}

// serviceLevel fills in the fields every port of svc shares.
func serviceLevel(svc *v1.Service, family v1.IPFamily) portView {
	var pv portView
	for _, ip := range svc.Spec.ExternalIPs {
		if familyOf(ip) == family {
			pv.ExternalIPs = append(pv.ExternalIPs, ip)
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		if familyOf(ing.IP) == family {
			pv.LoadBalancerIPs = append(pv.LoadBalancerIPs, ing.IP)
		}
	}
	for _, r := range svc.Spec.LoadBalancerSourceRanges {
		if ip, _, err := net.ParseCIDR(r); err == nil && familyOf(ip.String()) == family {
			pv.SourceRanges = append(pv.SourceRanges, r)
		}
	}
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		pv.StickySeconds = *svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds
	}
	externallyAccessible := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer ||
		(svc.Spec.Type == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) > 0)
	pv.ExternalLocal = externallyAccessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	pv.InternalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && pv.ExternalLocal {
		pv.HealthCheckNodePort = svc.Spec.HealthCheckNodePort
	}
	if svc.Spec.TrafficDistribution != nil {
		pv.TrafficDistribution = *svc.Spec.TrafficDistribution
	}
	return pv
}

// endpointsOf merges the endpoints of one Service port over the Service's slices of family: a slice port
// with the same name and protocol and a usable number contributes the first address of each endpoint.
// An endpoint listed twice counts once; where the copies differ the non-terminating one is kept (upstream
// keeps whichever its map iteration meets first, so the test only writes duplicates that differ in that
// way, and the proxy documents this tie-break). The result is sorted by "ip:port" string.
func endpointsOf(o *objects, svc *v1.Service, family v1.IPFamily, portName string, protocol v1.Protocol) []endpointView {
	byAddr := map[string]endpointView{}
	for _, es := range o.slices {
		if es.Namespace != svc.Namespace || es.Labels[discovery.LabelServiceName] != svc.Name {
			continue
		}
		if (family == v1.IPv4Protocol && es.AddressType != discovery.AddressTypeIPv4) ||
			(family == v1.IPv6Protocol && es.AddressType != discovery.AddressTypeIPv6) {
			continue
		}
		for _, p := range es.Ports {
			name, proto := "", v1.ProtocolTCP
			if p.Name != nil {
				name = *p.Name
			}
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if name != portName || proto != protocol || p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
				continue
			}
			for _, ep := range es.Endpoints {
				if len(ep.Addresses) == 0 || familyOf(ep.Addresses[0]) != family {
					continue
				}
				ev := endpointView{
					Addr:        net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(*p.Port))),
					Ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
					Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
					Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
				}
				if ep.NodeName != nil {
					ev.Node = *ep.NodeName
					ev.Local = ev.Node == o.nodeName
				}
				if ep.Zone != nil {
					ev.Zone = *ep.Zone
				}
				if ep.Hints != nil {
					for _, z := range ep.Hints.ForZones {
						ev.ZoneHints = append(ev.ZoneHints, z.Name)
					}
					for _, n := range ep.Hints.ForNodes {
						ev.NodeHints = append(ev.NodeHints, n.Name)
					}
					slices.Sort(ev.ZoneHints)
					slices.Sort(ev.NodeHints)
				}
				if old, dup := byAddr[ev.Addr]; dup && !(old.Terminating && !ev.Terminating) {
					continue
				}
				byAddr[ev.Addr] = ev
			}
		}
	}
	out := make([]endpointView, 0, len(byAddr))
	for _, ev := range byAddr {
		out = append(out, ev)
	}
	slices.SortFunc(out, func(a, b endpointView) int {
		switch {
		case a.Addr < b.Addr:
			return -1
		case a.Addr > b.Addr:
			return 1
		}
		return 0
	})
	return out
}

// choose fills in which endpoints cluster-policy and local-policy traffic use, per upstream's
// CategorizeEndpoints: Ready endpoints (narrowed by topology hints for cluster traffic), else the serving
// and terminating ones; local traffic only uses this node's endpoints and ignores hints.
func choose(pv *portView, nodeName, zone string) {
	externallyAccessible := pv.NodePort != 0 || len(pv.ExternalIPs) > 0 || len(pv.LoadBalancerIPs) > 0
	pv.UsesCluster = !pv.InternalLocal || externallyAccessible
	pv.UsesLocal = pv.InternalLocal || (pv.ExternalLocal && externallyAccessible)
	fallback := func(e endpointView) bool { return e.Serving && e.Terminating }

	if pv.UsesCluster {
		mode := hintMode(pv.Endpoints, nodeName, zone)
		pv.Cluster = pick(pv.Endpoints, func(e endpointView) bool {
			switch {
			case !e.Ready:
				return false
			case mode == "node":
				return slices.Contains(e.NodeHints, nodeName)
			case mode == "zone":
				return slices.Contains(e.ZoneHints, zone)
			}
			return true
		})
		if len(pv.Cluster) == 0 {
			pv.Cluster = pick(pv.Endpoints, fallback)
		}
		pv.HasAny = len(pv.Cluster) > 0
	}
	if pv.UsesLocal {
		pv.Local = pick(pv.Endpoints, func(e endpointView) bool { return e.Local && e.Ready })
		if len(pv.Local) == 0 {
			pv.Local = pick(pv.Endpoints, func(e endpointView) bool { return e.Local && fallback(e) })
		}
		for _, e := range pv.Endpoints {
			if e.Ready || fallback(e) {
				pv.HasAny = true
			}
		}
	}
}

// hintMode returns "node" when every Ready endpoint has node hints and one names this node, else "zone"
// when every Ready endpoint has zone hints and one names this node's zone, else "".
func hintMode(eps []endpointView, nodeName, zone string) string {
	ready, allNode, forNode, allZone, forZone := 0, true, false, true, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		ready++
		allNode = allNode && len(e.NodeHints) > 0
		forNode = forNode || slices.Contains(e.NodeHints, nodeName)
		allZone = allZone && len(e.ZoneHints) > 0
		forZone = forZone || (zone != "" && slices.Contains(e.ZoneHints, zone))
	}
	switch {
	case ready == 0:
		return ""
	case allNode && forNode:
		return "node"
	case allZone && forZone:
		return "zone"
	}
	return ""
}

func pick(eps []endpointView, keep func(endpointView) bool) []string {
	out := []string{}
	for _, e := range eps {
		if keep(e) {
			out = append(out, e.Addr)
		}
	}
	return out
}

func ref[T any](v T) *T { return &v }

// familyOf returns the family of an address in text form ("" when it is not one).
func familyOf(s string) v1.IPFamily {
	ip, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return ""
	case ip.Is4():
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}
