package proxy

import (
	"net/netip"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName identifies one port of one Service: namespace, name, port name and protocol.
// Its String form ("ns/name" or "ns/name:port") is what upstream hashes into chain names.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

// String returns "namespace/name" followed by ":port" when the port is named.
func (n ServicePortName) String() string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s
}

// Compare orders ServicePortNames by namespace, name, port name and protocol.
func (n ServicePortName) Compare(o ServicePortName) int {
	switch {
	case n.Namespace != o.Namespace:
		return cmpString(n.Namespace, o.Namespace)
	case n.Name != o.Name:
		return cmpString(n.Name, o.Name)
	case n.Port != o.Port:
		return cmpString(n.Port, o.Port)
	default:
		return cmpString(string(n.Protocol), string(o.Protocol))
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ServicePort is the immutable, family-specific view of one Service port that dataplanes program: where
// traffic arrives (cluster IP, node port, external and load-balancer IPs), how it is treated (affinity,
// traffic policies, source ranges) and where it goes (its endpoints and the endpoints selected for cluster
// and for local traffic). Dataplanes must not modify it; a new value replaces it when anything changes.
type ServicePort struct {
	Name      ServicePortName
	ClusterIP netip.Addr
	Port      int32
	Protocol  v1.Protocol
	// NodePort is 0 when the Service has none.
	NodePort int32
	// ExternalIPs are spec.externalIPs of this family (empty when the AllowServiceExternalIPs gate is off).
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are status.loadBalancer.ingress IPs of this family whose ipMode is VIP (or unset).
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges of this family; empty when unset or when one of them is a zero-length prefix.
	LoadBalancerSourceRanges []netip.Prefix
	// StickyMaxAgeSeconds is the ClientIP session affinity timeout; 0 means no session affinity.
	StickyMaxAgeSeconds int32
	// ExternalPolicyLocal is externalTrafficPolicy Local on an externally accessible Service.
	ExternalPolicyLocal bool
	// InternalPolicyLocal is internalTrafficPolicy Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort is set for LoadBalancer Services with externalTrafficPolicy Local.
	HealthCheckNodePort int32
	// TrafficDistribution is spec.trafficDistribution (informational: topology is carried by endpoint hints).
	TrafficDistribution string

	// Endpoints are all endpoints of this port, merged over the Service's EndpointSlices, duplicates
	// collapsed, sorted by their "ip:port" string.
	Endpoints []Endpoint
	// ClusterEndpoints are the endpoints for traffic under Cluster policy (nil if the port never uses them).
	ClusterEndpoints []Endpoint
	// LocalEndpoints are the endpoints for traffic under Local policy (nil if the port never uses them).
	LocalEndpoints []Endpoint
	// HasAnyEndpoints reports usable endpoints anywhere in the cluster, even if none is usable from here.
	HasAnyEndpoints bool
}

// SessionAffinity reports whether ClientIP session affinity is on.
func (s *ServicePort) SessionAffinity() bool { return s.StickyMaxAgeSeconds > 0 }

// ExternallyAccessible reports whether traffic can arrive from outside the cluster network.
func (s *ServicePort) ExternallyAccessible() bool {
	return s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
}

// UsesClusterEndpoints reports whether some traffic to this port is under Cluster policy.
func (s *ServicePort) UsesClusterEndpoints() bool {
	return !s.InternalPolicyLocal || s.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether some traffic to this port is under Local policy.
func (s *ServicePort) UsesLocalEndpoints() bool {
	return s.InternalPolicyLocal || (s.ExternalPolicyLocal && s.ExternallyAccessible())
}

// Endpoint is one backend of a ServicePort.
type Endpoint struct {
	// Addr is "ip:port" ("[ip]:port" for IPv6), the key endpoints are sorted and hashed by.
	Addr string
	IP   netip.Addr
	Port int32
	// Ready, Serving and Terminating are the EndpointSlice conditions (Ready and Serving default to true).
	Ready       bool
	Serving     bool
	Terminating bool
	// IsLocal reports that the endpoint runs on this node.
	IsLocal  bool
	NodeName string
	Zone     string
	// Hints are the topology hints; nil when the endpoint has none (most have none, and a pointer keeps
	// the Endpoint, of which a large cluster holds hundreds of thousands, at 88 bytes).
	Hints *Hints
}

// Hints are an endpoint's topology hints, each list sorted.
type Hints struct {
	Zones []string
	Nodes []string
}

// ZoneHints returns the zones the endpoint is hinted for (nil when none).
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns the nodes the endpoint is hinted for (nil when none).
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// NewEndpoint returns an endpoint with Addr filled in from ip and port.
func NewEndpoint(ip netip.Addr, port int32) Endpoint {
	return Endpoint{Addr: netip.AddrPortFrom(ip, uint16(port)).String(), IP: ip, Port: port}
}

// String returns "ip:port".
func (e *Endpoint) String() string { return e.Addr }

// AddrPort returns the endpoint's address and port.
func (e *Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.IP, uint16(e.Port)) }

// Node holds the facts about this node that dataplanes need, for one IP family.
type Node struct {
	// Name is the node name kube-proxy runs as (hostnameOverride or the hostname).
	Name string
	// Known is false until the Node object has been seen, and again after it is deleted.
	Known bool
	// IPs are the node's addresses of this family, InternalIP first (upstream's order).
	IPs []netip.Addr
	// PodCIDRs are spec.podCIDRs of this family.
	PodCIDRs []netip.Prefix
	// Zone is the topology.kubernetes.io/zone label.
	Zone string
}

// Equal reports whether two Node values carry the same facts.
func (n *Node) Equal(o *Node) bool {
	return n.Name == o.Name && n.Known == o.Known && n.Zone == o.Zone &&
		equalSlices(n.IPs, o.IPs) && equalSlices(n.PodCIDRs, o.PodCIDRs)
}

func equalSlices[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }
