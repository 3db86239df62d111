package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// LabelServiceProxyName marks a Service as handled by another proxy; kube-proxy ignores it.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// serviceOptions are the cluster-wide switches that change how a Service is read.
type serviceOptions struct {
	// externalIPs is the AllowServiceExternalIPs feature gate (on by default).
	externalIPs bool
}

// serviceSpec is what the proxy reads of a Service. The Tracker keeps one per Service instead of the API
// object, a fifth of its size (at 10,000 Services the objects were a fifth of the daemon's heap), and
// compares two of them to tell whether an update changes anything. Fields are kept as the API wrote them;
// servicePorts parses and reports them, so a bad field is reported each time it is used.
type serviceSpec struct {
	// skip is why the Service is not proxied at all ("" when it is): see skipService.
	skip        string
	typ         v1.ServiceType
	clusterIP   string
	clusterIPs  []string
	ipFamilies  []v1.IPFamily
	ports       []specPort
	externalIPs []string
	// lbIPs are status.loadBalancer.ingress[].ip, "" where an entry has no IP or is not in VIP mode (so
	// that indices stay those of the object).
	lbIPs               []string
	sourceRanges        []string
	externalPolicy      v1.ServiceExternalTrafficPolicy
	internalPolicy      v1.ServiceInternalTrafficPolicy
	trafficDistribution string
	affinity            v1.ServiceAffinity
	// affinityTimeout is sessionAffinityConfig.clientIP.timeoutSeconds, nil when unset.
	affinityTimeout     *int32
	healthCheckNodePort int32
}

// specPort is one of spec.ports.
type specPort struct {
	name     string
	protocol v1.Protocol
	port     int32
	nodePort int32
}

// newServiceSpec extracts what the proxy reads from a Service.
func newServiceSpec(svc *v1.Service) *serviceSpec {
	sp := &svc.Spec
	// Enumerations are replaced by the constants they equal, so that the decoded strings are not kept (a
	// few bytes each, for every Service).
	out := &serviceSpec{
		skip:                skipService(svc),
		typ:                 canon(sp.Type, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer),
		clusterIP:           sp.ClusterIP,
		clusterIPs:          slices.Clip(sp.ClusterIPs),
		ipFamilies:          canonFamilies(sp.IPFamilies),
		externalIPs:         slices.Clip(sp.ExternalIPs),
		sourceRanges:        slices.Clip(sp.LoadBalancerSourceRanges),
		externalPolicy:      canon(sp.ExternalTrafficPolicy, v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal),
		affinity:            canon(sp.SessionAffinity, v1.ServiceAffinityNone, v1.ServiceAffinityClientIP),
		healthCheckNodePort: sp.HealthCheckNodePort,
	}
	if len(out.clusterIPs) == 1 && out.clusterIPs[0] == out.clusterIP {
		out.clusterIP = out.clusterIPs[0] // one copy of the string
	}
	if sp.InternalTrafficPolicy != nil {
		out.internalPolicy = canon(*sp.InternalTrafficPolicy, v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal)
	}
	if sp.TrafficDistribution != nil {
		out.trafficDistribution = *sp.TrafficDistribution
	}
	if c := sp.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		t := *c.ClientIP.TimeoutSeconds
		out.affinityTimeout = &t
	}
	if len(sp.Ports) > 0 {
		out.ports = make([]specPort, len(sp.Ports))
		for i, p := range sp.Ports {
			out.ports[i] = specPort{name: p.Name, protocol: canon(p.Protocol, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP),
				port: p.Port, nodePort: p.NodePort}
		}
	}
	if ing := svc.Status.LoadBalancer.Ingress; len(ing) > 0 {
		out.lbIPs = make([]string, len(ing))
		for i, in := range ing {
			if in.IPMode == nil || *in.IPMode == v1.LoadBalancerIPModeVIP {
				out.lbIPs[i] = in.IP
			}
		}
	}
	return out
}

// canon returns the constant among known that v equals, or v.
func canon[T ~string](v T, known ...T) T {
	for _, k := range known {
		if v == k {
			return k
		}
	}
	return v
}

// The usual ipFamilies, shared by the specs that have them (never modified).
var (
	familiesV4   = []v1.IPFamily{v1.IPv4Protocol}
	familiesV6   = []v1.IPFamily{v1.IPv6Protocol}
	familiesV4V6 = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	familiesV6V4 = []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}
)

func canonFamilies(fs []v1.IPFamily) []v1.IPFamily {
	for _, c := range [][]v1.IPFamily{familiesV4, familiesV6, familiesV4V6, familiesV6V4} {
		if slices.Equal(fs, c) {
			return c
		}
	}
	return slices.Clip(fs)
}

// equal reports whether two specs are proxied identically (nil is no Service).
func (s *serviceSpec) equal(o *serviceSpec) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.skip == o.skip && s.typ == o.typ && s.clusterIP == o.clusterIP && slices.Equal(s.clusterIPs, o.clusterIPs) &&
		slices.Equal(s.ipFamilies, o.ipFamilies) && slices.Equal(s.ports, o.ports) &&
		slices.Equal(s.externalIPs, o.externalIPs) && slices.Equal(s.lbIPs, o.lbIPs) &&
		slices.Equal(s.sourceRanges, o.sourceRanges) && s.externalPolicy == o.externalPolicy &&
		s.internalPolicy == o.internalPolicy && s.trafficDistribution == o.trafficDistribution &&
		s.affinity == o.affinity && equalPtr(s.affinityTimeout, o.affinityTimeout) &&
		s.healthCheckNodePort == o.healthCheckNodePort
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// skipService reports why a Service is not proxied at all ("" when it is): headless and ExternalName Services
// and Services owned by another proxy.
func skipService(svc *v1.Service) string {
	switch {
	case svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone:
		return "headless"
	case svc.Spec.Type == v1.ServiceTypeExternalName:
		return "ExternalName"
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return "service-proxy-name label"
	}
	return ""
}

// servicePorts converts a Service (named nn) into its ServicePorts of one IP family. Fields that cannot be
// parsed are dropped and reported in problems; a Service without a cluster IP of this family yields no ports.
func servicePorts(nn types.NamespacedName, svc *serviceSpec, family v1.IPFamily, opts serviceOptions) (ports []*ServicePort, problems []string) {
	if svc.skip != "" {
		return nil, nil
	}
	cipStr := svc.clusterIPOfFamily(family)
	if cipStr == "" {
		return nil, nil
	}
	clusterIP, err := parseIP(cipStr)
	if err != nil {
		return nil, []string{fmt.Sprintf("spec.clusterIPs: %v", err)}
	}
	base := svc.sharedPort(clusterIP, family, opts, &problems)
	for i, p := range svc.ports {
		if sp := p.servicePort(i, nn, &base, &problems); sp != nil {
			ports = append(ports, sp)
		}
	}
	return ports, problems
}

// sharedPort returns what every ServicePort of the Service has in common: all but the port itself.
func (s *serviceSpec) sharedPort(clusterIP netip.Addr, family v1.IPFamily, opts serviceOptions, problems *[]string) ServicePort {
	externallyAccessible := s.typ == v1.ServiceTypeLoadBalancer || s.typ == v1.ServiceTypeNodePort ||
		(s.typ == v1.ServiceTypeClusterIP && len(s.externalIPs) > 0)
	base := ServicePort{
		ClusterIP:           clusterIP,
		ExternalPolicyLocal: externallyAccessible && s.externalPolicy == v1.ServiceExternalTrafficPolicyLocal,
		InternalPolicyLocal: s.internalPolicy == v1.ServiceInternalTrafficPolicyLocal,
		TrafficDistribution: s.trafficDistribution,
	}
	base.StickyMaxAgeSeconds = s.stickyMaxAgeSeconds(problems)
	if opts.externalIPs {
		base.ExternalIPs = s.externalIPsOf(family, problems)
	}
	base.LoadBalancerIPs = s.loadBalancerIPsOf(family, problems)
	base.LoadBalancerSourceRanges = s.sourceRangesOf(family, problems)
	if s.typ == v1.ServiceTypeLoadBalancer && base.ExternalPolicyLocal {
		base.HealthCheckNodePort = s.healthCheckNodePort
		if base.HealthCheckNodePort == 0 {
			*problems = append(*problems, "spec.healthCheckNodePort: missing on a LoadBalancer Service with externalTrafficPolicy Local")
		}
	}
	return base
}

// stickyMaxAgeSeconds returns the ClientIP session affinity timeout, 0 without session affinity.
func (s *serviceSpec) stickyMaxAgeSeconds(problems *[]string) int32 {
	if s.affinity != v1.ServiceAffinityClientIP {
		return 0
	}
	t := v1.DefaultClientIPServiceAffinitySeconds
	if s.affinityTimeout != nil {
		t = *s.affinityTimeout
	}
	if t <= 0 {
		*problems = append(*problems, fmt.Sprintf("spec.sessionAffinityConfig.clientIP.timeoutSeconds: %d is not positive", t))
		t = v1.DefaultClientIPServiceAffinitySeconds
	}
	return t
}

// externalIPsOf returns spec.externalIPs of the family. Blank entries are dropped silently.
func (s *serviceSpec) externalIPsOf(family v1.IPFamily, problems *[]string) (ips []netip.Addr) {
	for i, str := range s.externalIPs {
		ip, err := parseIP(str)
		if err != nil {
			if strings.TrimSpace(str) != "" {
				*problems = append(*problems, fmt.Sprintf("spec.externalIPs[%d]: %v", i, err))
			}
			continue
		}
		if ipFamily(ip) == family {
			ips = append(ips, ip)
		}
	}
	return ips
}

// loadBalancerIPsOf returns the load-balancer ingress IPs (in VIP mode) of the family.
func (s *serviceSpec) loadBalancerIPsOf(family v1.IPFamily, problems *[]string) (ips []netip.Addr) {
	for i, str := range s.lbIPs {
		if str == "" {
			continue
		}
		ip, err := parseIP(str)
		if err != nil {
			*problems = append(*problems, fmt.Sprintf("status.loadBalancer.ingress[%d].ip: %v", i, err))
			continue
		}
		if ipFamily(ip) == family {
			ips = append(ips, ip)
		}
	}
	return ips
}

// sourceRangesOf returns spec.loadBalancerSourceRanges of the family, or nil when one of them admits
// everyone (no filtering at all). Blank entries are dropped silently.
func (s *serviceSpec) sourceRangesOf(family v1.IPFamily, problems *[]string) (ranges []netip.Prefix) {
	for i, str := range s.sourceRanges {
		p, err := parseCIDR(str)
		if err != nil {
			if strings.TrimSpace(str) != "" {
				*problems = append(*problems, fmt.Sprintf("spec.loadBalancerSourceRanges[%d]: %v", i, err))
			}
			continue
		}
		if ipFamily(p.Addr()) != family {
			continue
		}
		if p.Bits() == 0 { // a range that admits everyone means no filtering at all
			return nil
		}
		ranges = append(ranges, p)
	}
	return ranges
}

// servicePort returns the ServicePort of spec.ports[i] on top of base, or nil (reported in problems) when
// its port numbers or protocol are invalid.
func (p *specPort) servicePort(i int, nn types.NamespacedName, base *ServicePort, problems *[]string) *ServicePort {
	if p.port <= 0 || p.port > 65535 {
		*problems = append(*problems, fmt.Sprintf("spec.ports[%d].port: %d is out of range", i, p.port))
		return nil
	}
	if p.nodePort < 0 || p.nodePort > 65535 {
		*problems = append(*problems, fmt.Sprintf("spec.ports[%d].nodePort: %d is out of range", i, p.nodePort))
		return nil
	}
	proto := p.protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	if proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP {
		*problems = append(*problems, fmt.Sprintf("spec.ports[%d].protocol: %q is not TCP, UDP or SCTP", i, proto))
		return nil
	}
	sp := *base
	sp.Name = ServicePortName{NamespacedName: nn, Port: p.name, Protocol: proto}
	sp.Port = p.port
	sp.Protocol = proto
	sp.NodePort = p.nodePort
	return &sp
}

// clusterIPOfFamily returns the Service's cluster IP of the given family, or "".
func (s *serviceSpec) clusterIPOfFamily(family v1.IPFamily) string {
	if len(s.ipFamilies) == 0 {
		// An object written before dual-stack: the single cluster IP decides.
		if ip, err := parseIP(s.clusterIP); err == nil && ipFamily(ip) == family {
			return s.clusterIP
		}
		return ""
	}
	for i, f := range s.ipFamilies {
		if f == family && i < len(s.clusterIPs) {
			return s.clusterIPs[i]
		}
	}
	return ""
}

// ipFamily returns the family of an address.
func ipFamily(ip netip.Addr) v1.IPFamily {
	if ip.Is4() || ip.Is4In6() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// parseIP parses an address the way the API server accepts it: IPv4 octets may carry leading zeros (which
// are decimal, not octal) and IPv4-mapped IPv6 addresses become IPv4.
func parseIP(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	ip, err := netip.ParseAddr(s)
	if err != nil {
		fixed, ok := stripLeadingZeros(s)
		if !ok {
			return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
		}
		if ip, err = netip.ParseAddr(fixed); err != nil {
			return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
		}
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q has a zone", s)
	}
	return ip.Unmap(), nil
}

// parseCIDR parses a prefix, accepting leading zeros like parseIP, and returns it masked.
func parseCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	ip, err := parseIP(addr)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	p, err := netip.ParsePrefix(ip.String() + "/" + bits)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	return p.Masked(), nil
}

// stripLeadingZeros rewrites a dotted-quad with leading zeros ("010.001.002.003") as plain decimal.
func stripLeadingZeros(s string) (string, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return "", false
	}
	for i, p := range parts {
		if p == "" || len(p) > 3 {
			return "", false
		}
		t := strings.TrimLeft(p, "0")
		if t == "" {
			t = "0"
		}
		parts[i] = t
	}
	return strings.Join(parts, "."), true
}
