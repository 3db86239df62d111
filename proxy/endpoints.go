package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AnnotationLastChangeTriggerTime is set by the EndpointSlice controller to the time of the change that
// caused the slice to be written; network programming latency is measured from it.
const AnnotationLastChangeTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"

// parsedSlice is an EndpointSlice reduced to what the proxy uses, parsed once when the event arrives.
type parsedSlice struct {
	name   string
	family v1.IPFamily
	ports  []slicePort
	// endpoints have Port 0, filled in per slicePort, unless final is set: then the slice has one port,
	// and endpoints are what endpointsFor would make of it alone (Port and Addr set, sorted by Addr, no
	// duplicates), which a snapshot can share.
	endpoints []Endpoint
	final     bool
	// triggerTime is the last-change-trigger-time annotation (zero when absent or unparsable).
	triggerTime time.Time
}

type slicePort struct {
	name     string
	protocol v1.Protocol
	port     int32
}

// sliceService returns the Service an EndpointSlice belongs to (its kubernetes.io/service-name label).
// errOtherProxy marks a slice of a Service that another proxy serves (service-proxy-name label).
var errOtherProxy = errors.New("served by another proxy (" + LabelServiceProxyName + ")")

func sliceService(es *discovery.EndpointSlice) (types.NamespacedName, error) {
	name := es.Labels[discovery.LabelServiceName]
	if name == "" {
		return types.NamespacedName{}, fmt.Errorf("no %s label", discovery.LabelServiceName)
	}
	return types.NamespacedName{Namespace: es.Namespace, Name: name}, nil
}

// parseSlice converts an EndpointSlice for a node named nodeName. Unusable ports and endpoints are dropped
// and reported in problems. FQDN slices yield nil.
func parseSlice(es *discovery.EndpointSlice, nodeName string) (ps *parsedSlice, problems []string) {
	var family v1.IPFamily
	switch es.AddressType {
	case discovery.AddressTypeIPv4:
		family = v1.IPv4Protocol
	case discovery.AddressTypeIPv6:
		family = v1.IPv6Protocol
	default:
		return nil, nil
	}
	ps = &parsedSlice{name: es.Name, family: family}
	ps.triggerTime = parseTriggerTime(es, &problems)
	ps.ports = parseSlicePorts(es.Ports, &problems)
	if len(es.Endpoints) > 0 {
		ps.endpoints = make([]Endpoint, 0, len(es.Endpoints))
	}
	for i := range es.Endpoints {
		if e, ok := parseEndpoint(es, i, family, nodeName, &problems); ok {
			ps.endpoints = append(ps.endpoints, e)
		}
	}
	if len(ps.ports) == 1 {
		ps.finishSinglePort()
	}
	return ps, problems
}

// parseTriggerTime returns the slice's last-change-trigger-time annotation, zero when absent or (reported
// in problems) unparsable.
func parseTriggerTime(es *discovery.EndpointSlice, problems *[]string) time.Time {
	s := es.Annotations[AnnotationLastChangeTriggerTime]
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		*problems = append(*problems, fmt.Sprintf("annotation %s: %q is not an RFC 3339 time", AnnotationLastChangeTriggerTime, s))
		return time.Time{}
	}
	return t
}

// parseSlicePorts converts the slice's ports, dropping (and reporting) those without a valid number.
func parseSlicePorts(in []discovery.EndpointPort, problems *[]string) []slicePort {
	if len(in) == 0 {
		return nil
	}
	out := make([]slicePort, 0, len(in))
	for i, p := range in {
		switch {
		case p.Port == nil:
			*problems = append(*problems, fmt.Sprintf("ports[%d].port: missing", i))
			continue
		case *p.Port <= 0 || *p.Port > 65535:
			*problems = append(*problems, fmt.Sprintf("ports[%d].port: %d is out of range", i, *p.Port))
			continue
		}
		sp := slicePort{port: *p.Port, protocol: v1.ProtocolTCP}
		if p.Name != nil {
			sp.name = *p.Name
		}
		if p.Protocol != nil {
			sp.protocol = *p.Protocol
		}
		out = append(out, sp)
	}
	return out
}

// parseEndpoint converts the slice's endpoint i (without its port). It reports false, and the reason in
// problems, when the endpoint has no usable address of the slice's family.
func parseEndpoint(es *discovery.EndpointSlice, i int, family v1.IPFamily, nodeName string, problems *[]string) (Endpoint, bool) {
	ep := &es.Endpoints[i]
	if len(ep.Addresses) == 0 {
		*problems = append(*problems, fmt.Sprintf("endpoints[%d].addresses: empty", i))
		return Endpoint{}, false
	}
	ip, err := parseIP(ep.Addresses[0])
	if err != nil {
		*problems = append(*problems, fmt.Sprintf("endpoints[%d].addresses[0]: %v", i, err))
		return Endpoint{}, false
	}
	if ipFamily(ip) != family {
		*problems = append(*problems, fmt.Sprintf("endpoints[%d].addresses[0]: %s is not an %s address as addressType says", i, ip, es.AddressType))
		return Endpoint{}, false
	}
	e := Endpoint{
		IP:          ip,
		Ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
		Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
		Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
	}
	if ep.NodeName != nil {
		e.NodeName = topologyNames.intern(*ep.NodeName)
		e.IsLocal = nodeName != "" && e.NodeName == nodeName
	}
	if ep.Zone != nil {
		e.Zone = topologyNames.intern(*ep.Zone)
	}
	e.Hints = parseHints(ep.Hints)
	return e, true
}

// parseHints converts an endpoint's topology hints, nil when it has none.
func parseHints(in *discovery.EndpointHints) *Hints {
	if in == nil || len(in.ForZones)+len(in.ForNodes) == 0 {
		return nil
	}
	h := &Hints{}
	for _, z := range in.ForZones {
		h.Zones = append(h.Zones, topologyNames.intern(z.Name))
	}
	for _, n := range in.ForNodes {
		h.Nodes = append(h.Nodes, topologyNames.intern(n.Name))
	}
	slices.Sort(h.Zones)
	slices.Sort(h.Nodes)
	return h
}

// finishSinglePort makes the endpoints of a slice with one port what endpointsFor would make of it alone
// (Port and Addr set, sorted by Addr), and marks them final unless two share an address.
func (ps *parsedSlice) finishSinglePort() {
	port := ps.ports[0].port
	for i := range ps.endpoints {
		ps.endpoints[i].Port = port
		ps.endpoints[i].Addr = NewEndpoint(ps.endpoints[i].IP, port).Addr
	}
	slices.SortFunc(ps.endpoints, func(a, b Endpoint) int { return cmpString(a.Addr, b.Addr) })
	ps.final = true
	for i := 1; i < len(ps.endpoints); i++ {
		if ps.endpoints[i].Addr == ps.endpoints[i-1].Addr {
			ps.final = false // duplicates: endpointsFor resolves them
			break
		}
	}
}

// topologyNames holds one copy of each node and zone name endpoints carry: the API decodes a string per
// endpoint, and a cluster has far fewer nodes than endpoints. It only grows (a cluster's node names, up to
// a bound), so it needs no cleanup.
var topologyNames = interner{max: 1 << 16}

// interner returns one shared copy of equal strings, for at most max distinct strings (others are
// returned as they are).
type interner struct {
	mu  sync.Mutex
	max int
	m   map[string]string
}

func (in *interner) intern(s string) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if c, ok := in.m[s]; ok {
		return c
	}
	if len(in.m) >= in.max {
		return s
	}
	if in.m == nil {
		in.m = map[string]string{}
	}
	s = strings.Clone(s) // not a substring of a larger decoded buffer
	in.m[s] = s
	return s
}

// endpointsFor merges the endpoints of one Service port over all of the Service's slices of one family:
// slices contribute the endpoints of their port with the same name and protocol; an endpoint seen twice
// (same ip:port) collapses into one, a non-terminating copy winning over a terminating one. The result is
// sorted by Addr.
func endpointsFor(slicesOfService []*parsedSlice, family v1.IPFamily, portName string, protocol v1.Protocol) []Endpoint {
	// The common case, one slice with this port, shares that slice's endpoints when they are final.
	var only *parsedSlice
	matches := 0
	for _, ps := range slicesOfService {
		if ps.family != family {
			continue
		}
		for _, sp := range ps.ports {
			if sp.name == portName && sp.protocol == protocol {
				only = ps
				matches++
			}
		}
	}
	switch {
	case matches == 0:
		return nil
	case matches == 1 && only.final:
		return only.endpoints
	}
	var out []Endpoint
	seen := map[string]int{}
	for _, ps := range slicesOfService {
		if ps.family != family {
			continue
		}
		for _, sp := range ps.ports {
			if sp.name != portName || sp.protocol != protocol {
				continue
			}
			for _, e := range ps.endpoints {
				e.Port = sp.port
				e.Addr = NewEndpoint(e.IP, sp.port).Addr
				if i, dup := seen[e.Addr]; dup {
					if !e.Terminating {
						out[i] = e
					}
					continue
				}
				seen[e.Addr] = len(out)
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return cmpString(a.Addr, b.Addr) })
	return out
}

// equalEndpoint reports whether two endpoints carry the same facts.
func equalEndpoint(a, b *Endpoint) bool {
	return a.Addr == b.Addr && a.Ready == b.Ready && a.Serving == b.Serving && a.Terminating == b.Terminating &&
		a.NodeName == b.NodeName && a.Zone == b.Zone && a.IsLocal == b.IsLocal &&
		slices.Equal(a.ZoneHints(), b.ZoneHints()) && slices.Equal(a.NodeHints(), b.NodeHints())
}

// sameParsedSlice reports whether two parsed slices carry the same facts (a nil a is never the same).
func sameParsedSlice(a, b *parsedSlice) bool {
	if a == nil || b == nil {
		return false
	}
	if a.name != b.name || a.family != b.family || !a.triggerTime.Equal(b.triggerTime) ||
		!slices.Equal(a.ports, b.ports) || len(a.endpoints) != len(b.endpoints) {
		return false
	}
	for i := range a.endpoints {
		if a.endpoints[i].IP != b.endpoints[i].IP || !equalEndpoint(&a.endpoints[i], &b.endpoints[i]) {
			return false
		}
	}
	return true
}

func equalEndpoints(a, b []Endpoint) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		if !equalEndpoint(&a[i], &b[i]) {
			return false
		}
	}
	return true
}

// Equal reports whether two ServicePorts would be programmed identically.
func (s *ServicePort) Equal(o *ServicePort) bool {
	return s.Name == o.Name && s.ClusterIP == o.ClusterIP && s.Port == o.Port && s.Protocol == o.Protocol &&
		s.NodePort == o.NodePort && slices.Equal(s.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(s.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		s.StickyMaxAgeSeconds == o.StickyMaxAgeSeconds && s.ExternalPolicyLocal == o.ExternalPolicyLocal &&
		s.InternalPolicyLocal == o.InternalPolicyLocal && s.HealthCheckNodePort == o.HealthCheckNodePort &&
		s.TrafficDistribution == o.TrafficDistribution && s.HasAnyEndpoints == o.HasAnyEndpoints &&
		equalEndpoints(s.Endpoints, o.Endpoints) && equalEndpoints(s.ClusterEndpoints, o.ClusterEndpoints) &&
		equalEndpoints(s.LocalEndpoints, o.LocalEndpoints)
}
