package proxy

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var netipCmp = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

// port returns the expected ServicePort for ns/name, with fields set by tweaks.
func wantPort(ns, name, portName string, proto v1.Protocol, clusterIP string, port, nodePort int32, tweaks ...func(*ServicePort)) *ServicePort {
	p := &ServicePort{
		Name:      spn(ns, name, portName, proto),
		ClusterIP: netip.MustParseAddr(clusterIP),
		Port:      port,
		Protocol:  proto,
		NodePort:  nodePort,
	}
	for _, tw := range tweaks {
		tw(p)
	}
	return p
}

func TestServicePorts(t *testing.T) {
	const ns = "ns"
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	gateOn := serviceOptions{externalIPs: true}
	local := v1.ServiceInternalTrafficPolicyLocal

	tests := []struct {
		name   string
		svc    *v1.Service
		family v1.IPFamily
		opts   serviceOptions
		want   []*ServicePort
		// problems lists a substring (the field path) of each expected problem, in order.
		problems []string
	}{
		{
			name:   "single-stack IPv4 on IPv4",
			svc:    makeService(ns, "a", "10.0.0.1", withPort("http", v1.ProtocolTCP, 80, 0)),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "a", "http", v1.ProtocolTCP, "10.0.0.1", 80, 0)},
		},
		{
			name:   "single-stack IPv4 on IPv6 yields nothing",
			svc:    makeService(ns, "a", "10.0.0.1", withPort("http", v1.ProtocolTCP, 80, 0)),
			family: v6,
		},
		{
			name:   "dual-stack IPv6-primary, IPv4 family",
			svc:    makeService(ns, "a", "", dualStack("fd00::1", "10.0.0.1"), withPort("", v1.ProtocolUDP, 53, 0)),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "a", "", v1.ProtocolUDP, "10.0.0.1", 53, 0)},
		},
		{
			name:   "dual-stack IPv6-primary, IPv6 family",
			svc:    makeService(ns, "a", "", dualStack("fd00::1", "10.0.0.1"), withPort("", v1.ProtocolUDP, 53, 0)),
			family: v6,
			want:   []*ServicePort{wantPort(ns, "a", "", v1.ProtocolUDP, "fd00::1", 53, 0)},
		},
		{
			name: "legacy object without ipFamilies, IPv4 cluster IP",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.IPFamilies, s.Spec.ClusterIPs = nil, nil
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0)},
		},
		{
			name: "legacy object without ipFamilies, IPv4 cluster IP, IPv6 family",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.IPFamilies, s.Spec.ClusterIPs = nil, nil
			}),
			family: v6,
		},
		{
			name: "legacy object without ipFamilies, IPv6 cluster IP",
			svc: makeService(ns, "a", "fd00::10", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.IPFamilies, s.Spec.ClusterIPs = nil, nil
			}),
			family: v6,
			want:   []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "fd00::10", 80, 0)},
		},
		{
			name:   "headless (None) is skipped",
			svc:    makeService(ns, "a", v1.ClusterIPNone, withPort("p", v1.ProtocolTCP, 80, 0)),
			family: v4,
		},
		{
			name:   "no cluster IP is skipped",
			svc:    makeService(ns, "a", "", withPort("p", v1.ProtocolTCP, 80, 0)),
			family: v4,
		},
		{
			name: "ExternalName with a cluster IP is skipped",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeExternalName
				s.Spec.ExternalName = "example.com"
			}),
			family: v4,
		},
		{
			name: "service-proxy-name label (even empty) is skipped",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Labels = map[string]string{LabelServiceProxyName: ""}
			}),
			family: v4,
		},
		{
			name: "unparsable cluster IP is reported, no ports",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.0.0.300"}
			}),
			family:   v4,
			problems: []string{"spec.clusterIPs"},
		},
		{
			name: "externalIPs by family, leading zeros accepted, bad ones reported, blank ignored",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1", "bogus", " ", "010.001.002.003", "::ffff:192.0.2.9"}
			}),
			family: v4,
			opts:   gateOn,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0, func(p *ServicePort) {
				p.ExternalIPs = addrs("192.0.2.1", "10.1.2.3", "192.0.2.9")
			})},
			problems: []string{"spec.externalIPs[2]"},
		},
		{
			name: "externalIPs of the IPv6 family",
			svc: makeService(ns, "a", "", dualStack("10.0.0.1", "fd00::1"), withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
			}),
			family: v6,
			opts:   gateOn,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "fd00::1", 80, 0, func(p *ServicePort) {
				p.ExternalIPs = addrs("2001:db8::1")
			})},
		},
		{
			name: "externalIPs ignored when the AllowServiceExternalIPs gate is off",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "bogus"}
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0)},
		},
		{
			name: "load-balancer ingress: VIP and unset ipMode used, Proxy and hostname-only skipped, family filtered",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "192.0.2.10"},
					{IP: "192.0.2.11", IPMode: ptr(v1.LoadBalancerIPModeVIP)},
					{IP: "192.0.2.12", IPMode: ptr(v1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
					{IP: "2001:db8::10"},
					{IP: "not-an-ip"},
				}
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080, func(p *ServicePort) {
				p.LoadBalancerIPs = addrs("192.0.2.10", "192.0.2.11")
			})},
			problems: []string{"status.loadBalancer.ingress[5]"},
		},
		{
			name: "source ranges masked, trimmed, other family ignored, bad reported",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{"10.1.2.3/24", " 192.168.0.0/28", "2001:db8::/32", "::/0", "nope", ""}
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080, func(p *ServicePort) {
				p.LoadBalancerSourceRanges = prefixes("10.1.2.0/24", "192.168.0.0/28")
			})},
			problems: []string{"spec.loadBalancerSourceRanges[4]"},
		},
		{
			name: "zero-length prefix of this family disables filtering",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{"10.1.2.0/24", "0.0.0.0/0", "192.168.0.0/16"}
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080)},
		},
		{
			name: "zero-length prefix with host bits still disables filtering",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{"10.1.2.0/24", "10.0.0.0/0"}
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080)},
		},
		{
			name: "zero-length prefix of the other family does not disable filtering",
			svc: makeService(ns, "lb", "", dualStack("10.0.0.1", "fd00::1"), withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{"0.0.0.0/0", "2001:db8:1::5/48"}
			}),
			family: v6,
			want: []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "fd00::1", 80, 30080, func(p *ServicePort) {
				p.LoadBalancerSourceRanges = prefixes("2001:db8:1::/48")
			})},
		},
		{
			name: "ClientIP affinity with a timeout",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0, func(p *ServicePort) {
				p.StickyMaxAgeSeconds = 60
			})},
		},
		{
			name: "ClientIP affinity without config gets the API default timeout",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0, func(p *ServicePort) {
				p.StickyMaxAgeSeconds = 10800
			})},
		},
		{
			name: "ClientIP affinity with a zero timeout is reported and defaulted",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0, func(p *ServicePort) {
				p.StickyMaxAgeSeconds = 10800
			})},
			problems: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"},
		},
		{
			name: "affinity None ignores a leftover config",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0)},
		},
		{
			name: "ETP Local on a ClusterIP Service without external IPs does not count",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0)},
		},
		{
			name: "ETP Local on a ClusterIP Service with external IPs counts",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			}),
			family: v4,
			opts:   gateOn,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0, func(p *ServicePort) {
				p.ExternalPolicyLocal = true
				p.ExternalIPs = addrs("192.0.2.1")
			})},
		},
		{
			name: "ETP Local on a NodePort Service: no health check node port",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 31000
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080, func(p *ServicePort) {
				p.ExternalPolicyLocal = true
			})},
		},
		{
			name: "ETP Local on a LoadBalancer Service: health check node port on every port",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("x", v1.ProtocolUDP, 8677, 30063), withPort("y", v1.ProtocolUDP, 8678, 30064), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 345
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.1.2.3"}}
			}),
			family: v4,
			want: []*ServicePort{
				wantPort(ns, "lb", "x", v1.ProtocolUDP, "10.0.0.1", 8677, 30063, func(p *ServicePort) {
					p.ExternalPolicyLocal, p.HealthCheckNodePort, p.LoadBalancerIPs = true, 345, addrs("10.1.2.3")
				}),
				wantPort(ns, "lb", "y", v1.ProtocolUDP, "10.0.0.1", 8678, 30064, func(p *ServicePort) {
					p.ExternalPolicyLocal, p.HealthCheckNodePort, p.LoadBalancerIPs = true, 345, addrs("10.1.2.3")
				}),
			},
		},
		{
			name: "ETP Cluster on a LoadBalancer Service ignores a health check node port",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
				s.Spec.HealthCheckNodePort = 31000
			}),
			family: v4,
			want:   []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080)},
		},
		{
			name: "ETP Local LoadBalancer without a health check node port is reported",
			svc: makeService(ns, "lb", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 30080), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "lb", "p", v1.ProtocolTCP, "10.0.0.1", 80, 30080, func(p *ServicePort) {
				p.ExternalPolicyLocal = true
			})},
			problems: []string{"spec.healthCheckNodePort"},
		},
		{
			name: "ITP Local and trafficDistribution",
			svc: makeService(ns, "a", "10.0.0.1", withPort("p", v1.ProtocolTCP, 80, 0), func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = &local
				s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose)
			}),
			family: v4,
			want: []*ServicePort{wantPort(ns, "a", "p", v1.ProtocolTCP, "10.0.0.1", 80, 0, func(p *ServicePort) {
				p.InternalPolicyLocal = true
				p.TrafficDistribution = "PreferClose"
			})},
		},
		{
			name: "bad ports are reported and dropped, good ones kept, empty protocol is TCP",
			svc: makeService(ns, "a", "10.0.0.1",
				withPort("zero", v1.ProtocolTCP, 0, 0),
				withPort("big", v1.ProtocolTCP, 70000, 0),
				withPort("badnp", v1.ProtocolTCP, 81, 70000),
				withPort("icmp", "ICMP", 82, 0),
				withPort("good", "", 83, 0),
				withPort("sctp", v1.ProtocolSCTP, 84, 0),
			),
			family: v4,
			want: []*ServicePort{
				wantPort(ns, "a", "good", v1.ProtocolTCP, "10.0.0.1", 83, 0),
				wantPort(ns, "a", "sctp", v1.ProtocolSCTP, "10.0.0.1", 84, 0),
			},
			problems: []string{"spec.ports[0].port", "spec.ports[1].port", "spec.ports[2].nodePort", "spec.ports[3].protocol"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := servicePorts(nn(tc.svc.Namespace, tc.svc.Name), newServiceSpec(tc.svc), tc.family, tc.opts)
			if diff := cmp.Diff(tc.want, got, netipCmp); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			if len(problems) != len(tc.problems) {
				t.Fatalf("problems = %q, want %d matching %q", problems, len(tc.problems), tc.problems)
			}
			for i, p := range problems {
				if !strings.Contains(p, tc.problems[i]) {
					t.Errorf("problem %d = %q, want it to name %q", i, p, tc.problems[i])
				}
			}
		})
	}
}

// TestServicePortsDistinct checks that ports of one Service do not share mutable slices with each other.
func TestServicePortsDistinct(t *testing.T) {
	svc := makeService("ns", "a", "10.0.0.1", withPort("a", v1.ProtocolTCP, 80, 0), withPort("b", v1.ProtocolTCP, 81, 0))
	ports, _ := servicePorts(nn(svc.Namespace, svc.Name), newServiceSpec(svc), v1.IPv4Protocol, serviceOptions{})
	if len(ports) != 2 || ports[0] == ports[1] {
		t.Fatalf("want two distinct ports, got %v", ports)
	}
	ports[0].Endpoints = []Endpoint{NewEndpoint(netip.MustParseAddr("10.1.0.1"), 80)}
	if ports[1].Endpoints != nil {
		t.Errorf("setting endpoints of one port changed the other")
	}
}

func TestServicePortName(t *testing.T) {
	tests := []struct {
		n    ServicePortName
		want string
	}{
		{spn("default", "kubernetes", "", v1.ProtocolTCP), "default/kubernetes"},
		{spn("ns", "web", "https", v1.ProtocolTCP), "ns/web:https"},
	}
	for _, tc := range tests {
		if got := tc.n.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.n, got, tc.want)
		}
	}
	// Compare orders by namespace, name, port name, protocol.
	ordered := []ServicePortName{
		spn("a", "z", "", v1.ProtocolTCP),
		spn("b", "a", "", v1.ProtocolTCP),
		spn("b", "a", "", v1.ProtocolUDP),
		spn("b", "a", "x", v1.ProtocolSCTP),
		spn("b", "b", "", v1.ProtocolTCP),
	}
	for i := range ordered {
		for j := range ordered {
			got := ordered[i].Compare(ordered[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got != want {
				t.Errorf("Compare(%v, %v) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
}

func TestParseIPAndCIDR(t *testing.T) {
	ipTests := []struct {
		in, want string // want "" means an error
	}{
		{"10.0.0.1", "10.0.0.1"},
		{" 10.0.0.1 ", "10.0.0.1"},
		{"010.000.000.001", "10.0.0.1"},
		{"::ffff:10.0.0.1", "10.0.0.1"},
		{"fd00::1", "fd00::1"},
		{"fe80::1%eth0", ""},
		{"10.0.0.256", ""},
		{"1.2.3", ""},
		{"0x0a.0.0.1", ""},
		{"", ""},
	}
	for _, tc := range ipTests {
		got, err := parseIP(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("parseIP(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != netip.MustParseAddr(tc.want) {
			t.Errorf("parseIP(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	cidrTests := []struct {
		in, want string
	}{
		{"10.1.2.3/24", "10.1.2.0/24"},
		{"010.001.002.000/24", "10.1.2.0/24"},
		{"fd00::5/64", "fd00::/64"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"10.0.0.0/33", ""},
		{"10.0.0.0", ""},
		{"x/8", ""},
	}
	for _, tc := range cidrTests {
		got, err := parseCIDR(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("parseCIDR(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != netip.MustParsePrefix(tc.want) {
			t.Errorf("parseCIDR(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// TestServiceSpecEqual: every change to a field the proxy reads makes two specs differ, and changes to
// anything else (annotations, selector, resource version, conditions) do not.
func TestServiceSpecEqual(t *testing.T) {
	base := func() *v1.Service {
		s := makeService("ns", "a", "10.0.0.1", withPort("http", v1.ProtocolTCP, 80, 30080))
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.1"}}
		return s
	}
	local := v1.ServiceInternalTrafficPolicyLocal
	proxyMode := v1.LoadBalancerIPModeProxy
	timeout := int32(60)
	dist := "PreferClose"
	differ := map[string]func(s *v1.Service){
		"type":                 func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort },
		"clusterIP":            func(s *v1.Service) { s.Spec.ClusterIP = "10.0.0.2" },
		"clusterIPs":           func(s *v1.Service) { s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, "fd00::1") },
		"ipFamilies":           func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} },
		"port":                 func(s *v1.Service) { s.Spec.Ports[0].Port = 81 },
		"port name":            func(s *v1.Service) { s.Spec.Ports[0].Name = "web" },
		"port protocol":        func(s *v1.Service) { s.Spec.Ports[0].Protocol = v1.ProtocolUDP },
		"nodePort":             func(s *v1.Service) { s.Spec.Ports[0].NodePort = 30081 },
		"externalIPs":          func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.9"} },
		"ingress IP":           func(s *v1.Service) { s.Status.LoadBalancer.Ingress[0].IP = "192.0.2.2" },
		"ingress mode":         func(s *v1.Service) { s.Status.LoadBalancer.Ingress[0].IPMode = &proxyMode },
		"source ranges":        func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"} },
		"external policy":      func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal },
		"internal policy":      func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local },
		"traffic distribution": func(s *v1.Service) { s.Spec.TrafficDistribution = &dist },
		"affinity":             func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP },
		"affinity timeout": func(s *v1.Service) {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
		},
		"health check port": func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 },
		"proxy-name label":  func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} },
		"ExternalName":      func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName },
	}
	same := map[string]func(s *v1.Service){
		"annotations":      func(s *v1.Service) { s.Annotations = map[string]string{"a": "b"} },
		"other labels":     func(s *v1.Service) { s.Labels = map[string]string{"app": "web"} },
		"selector":         func(s *v1.Service) { s.Spec.Selector = map[string]string{"app": "web"} },
		"resource version": func(s *v1.Service) { s.ResourceVersion = "99" },
		"target port":      func(s *v1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromInt32(8080) },
		"conditions":       func(s *v1.Service) { s.Status.Conditions = []metav1.Condition{{Type: "x"}} },
		"ingress hostname": func(s *v1.Service) { s.Status.LoadBalancer.Ingress[0].Hostname = "lb.example" },
	}
	want := newServiceSpec(base())
	for name, f := range differ {
		s := base()
		f(s)
		if newServiceSpec(s).equal(want) {
			t.Errorf("%s: a change the proxy reads compares equal", name)
		}
	}
	for name, f := range same {
		s := base()
		f(s)
		if !newServiceSpec(s).equal(want) {
			t.Errorf("%s: a change the proxy ignores compares different", name)
		}
	}
	if !(*serviceSpec)(nil).equal(nil) || want.equal(nil) {
		t.Error("nil specs compare wrongly")
	}
	// Every field of serviceSpec is compared: changing any one of them makes the specs differ.
	rv := reflect.ValueOf(want).Elem()
	for i := 0; i < rv.NumField(); i++ {
		cp := *want
		f := reflect.ValueOf(&cp).Elem().Field(i)
		f = reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem()
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int32:
			f.SetInt(f.Int() + 1)
		case reflect.Slice:
			f.Set(reflect.Append(f, reflect.Zero(f.Type().Elem())))
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		default:
			t.Fatalf("field %s of kind %s: teach this test to change it", rv.Type().Field(i).Name, f.Kind())
		}
		if cp.equal(want) {
			t.Errorf("field %s is not compared", rv.Type().Field(i).Name)
		}
	}
}
