package proxy

import (
	"fmt"
	"net/netip"
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

// servicePorts converts a Service into its ServicePorts of one IP family. Fields that cannot be parsed are
// dropped and reported in problems; a Service without a cluster IP of this family yields no ports.
func servicePorts(svc *v1.Service, family v1.IPFamily, opts serviceOptions) (ports []*ServicePort, problems []string) {
	if skipService(svc) != "" {
		return nil, nil
	}
	cipStr := clusterIPOfFamily(svc, family)
	if cipStr == "" {
		return nil, nil
	}
	clusterIP, err := parseIP(cipStr)
	if err != nil {
		return nil, []string{fmt.Sprintf("spec.clusterIPs: %v", err)}
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}

	externallyAccessible := svc.Spec.Type == v1.ServiceTypeLoadBalancer || svc.Spec.Type == v1.ServiceTypeNodePort ||
		(svc.Spec.Type == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) > 0)
	base := ServicePort{
		ClusterIP:           clusterIP,
		ExternalPolicyLocal: externallyAccessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal,
		InternalPolicyLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
	}
	if svc.Spec.TrafficDistribution != nil {
		base.TrafficDistribution = *svc.Spec.TrafficDistribution
	}
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		base.StickyMaxAgeSeconds = v1.DefaultClientIPServiceAffinitySeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			base.StickyMaxAgeSeconds = *c.ClientIP.TimeoutSeconds
		}
		if base.StickyMaxAgeSeconds <= 0 {
			problems = append(problems, fmt.Sprintf("spec.sessionAffinityConfig.clientIP.timeoutSeconds: %d is not positive", base.StickyMaxAgeSeconds))
			base.StickyMaxAgeSeconds = v1.DefaultClientIPServiceAffinitySeconds
		}
	}
	if opts.externalIPs {
		for i, s := range svc.Spec.ExternalIPs {
			ip, err := parseIP(s)
			if err != nil {
				if strings.TrimSpace(s) != "" {
					problems = append(problems, fmt.Sprintf("spec.externalIPs[%d]: %v", i, err))
				}
				continue
			}
			if ipFamily(ip) == family {
				base.ExternalIPs = append(base.ExternalIPs, ip)
			}
		}
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		ip, err := parseIP(ing.IP)
		if err != nil {
			problems = append(problems, fmt.Sprintf("status.loadBalancer.ingress[%d].ip: %v", i, err))
			continue
		}
		if ipFamily(ip) == family {
			base.LoadBalancerIPs = append(base.LoadBalancerIPs, ip)
		}
	}
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := parseCIDR(s)
		if err != nil {
			if strings.TrimSpace(s) != "" {
				problems = append(problems, fmt.Sprintf("spec.loadBalancerSourceRanges[%d]: %v", i, err))
			}
			continue
		}
		if ipFamily(p.Addr()) != family {
			continue
		}
		if p.Bits() == 0 { // a range that admits everyone means no filtering at all
			base.LoadBalancerSourceRanges = nil
			break
		}
		base.LoadBalancerSourceRanges = append(base.LoadBalancerSourceRanges, p)
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && base.ExternalPolicyLocal {
		base.HealthCheckNodePort = svc.Spec.HealthCheckNodePort
		if base.HealthCheckNodePort == 0 {
			problems = append(problems, "spec.healthCheckNodePort: missing on a LoadBalancer Service with externalTrafficPolicy Local")
		}
	}

	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if p.Port <= 0 || p.Port > 65535 {
			problems = append(problems, fmt.Sprintf("spec.ports[%d].port: %d is out of range", i, p.Port))
			continue
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			problems = append(problems, fmt.Sprintf("spec.ports[%d].nodePort: %d is out of range", i, p.NodePort))
			continue
		}
		proto := p.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP {
			problems = append(problems, fmt.Sprintf("spec.ports[%d].protocol: %q is not TCP, UDP or SCTP", i, proto))
			continue
		}
		sp := base
		sp.Name = ServicePortName{NamespacedName: nn, Port: p.Name, Protocol: proto}
		sp.Port = p.Port
		sp.Protocol = proto
		sp.NodePort = p.NodePort
		ports = append(ports, &sp)
	}
	return ports, problems
}

// clusterIPOfFamily returns the Service's cluster IP of the given family, or "".
func clusterIPOfFamily(svc *v1.Service, family v1.IPFamily) string {
	if len(svc.Spec.IPFamilies) == 0 {
		// An object written before dual-stack: the single cluster IP decides.
		if ip, err := parseIP(svc.Spec.ClusterIP); err == nil && ipFamily(ip) == family {
			return svc.Spec.ClusterIP
		}
		return ""
	}
	for i, f := range svc.Spec.IPFamilies {
		if f == family && i < len(svc.Spec.ClusterIPs) {
			return svc.Spec.ClusterIPs[i]
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
