package model

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// This file describes the objects the test starts from. Service i gets a mix of features chosen by i, so
// that 200 Services cover every combination the expectation distinguishes.

const (
	nodeName  = "node-a"
	zoneA     = "zone-a"
	zoneB     = "zone-b"
	nServices = 200
)

// nodeZones is the zone of each node the endpoints run on.
var nodeZones = map[string]string{"node-a": zoneA, "node-b": zoneB, "node-c": zoneA}

// svcName is the name of planned Service i.
func svcName(i int) string { return fmt.Sprintf("svc-%03d", i) }

// planNode is this node: zone-a, dual-stack addresses and pod CIDRs.
func planNode(zone string) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}},
		Spec:       v1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:10:244::/64"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeHostName, Address: nodeName},
			{Type: v1.NodeExternalIP, Address: "192.0.2.250"},
			{Type: v1.NodeInternalIP, Address: "10.250.0.1"},
			{Type: v1.NodeInternalIP, Address: "fd00:10:250::1"},
		}},
	}
	if zone != "" {
		n.Labels[v1.LabelTopologyZone] = zone
	}
	return n
}

// planService returns Service i in namespace ns:
//   - i%4==0 dual-stack (RequireDualStack), i%10==7 IPv6 only, else IPv4;
//   - i%3==0 ports http/TCP and dns/UDP, else i%5==1 ports a, b (TCP) and s (SCTP), else one unnamed port;
//   - i%6==1 NodePort, i%6==2 LoadBalancer (i%12==2 without node ports; ingress IPs unless i%24==14, one
//     of them ipMode Proxy; source ranges when (i/6)%3==1), else ClusterIP (externalIPs when i%9==3);
//   - externalTrafficPolicy Local on externally accessible Services when (i/6)%2==0;
//   - internalTrafficPolicy Local when i%7==3; ClientIP affinity when i%11==5 (timeout 300 when i%22==5);
//   - trafficDistribution PreferClose when i%13==4 (zone hints), PreferSameNode when i%13==8 (node hints).
func planService(ns string, i int) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svcName(i), Labels: map[string]string{"app": svcName(i)}}}
	dual := i%4 == 0
	switch {
	case dual:
		s.Spec.IPFamilyPolicy = ref(v1.IPFamilyPolicyRequireDualStack)
	case i%10 == 7:
		s.Spec.IPFamilyPolicy = ref(v1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
	}
	switch {
	case i%3 == 0:
		s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}}
	case i%5 == 1:
		s.Spec.Ports = []v1.ServicePort{{Name: "a", Port: 8080, Protocol: v1.ProtocolTCP}, {Name: "b", Port: 8443, Protocol: v1.ProtocolTCP},
			{Name: "s", Port: 9000, Protocol: v1.ProtocolSCTP}}
	default:
		s.Spec.Ports = []v1.ServicePort{{Port: int32(80 + i%7), Protocol: v1.ProtocolTCP}}
	}
	external := false
	switch i % 6 {
	case 1:
		s.Spec.Type = v1.ServiceTypeNodePort
		external = true
	case 2:
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		external = true
		if i%12 == 2 {
			s.Spec.AllocateLoadBalancerNodePorts = ref(false)
		}
		if i%24 != 14 {
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
				{IP: fmt.Sprintf("192.0.2.%d", i%250)},
				{IP: fmt.Sprintf("198.18.0.%d", i%250), IPMode: ref(v1.LoadBalancerIPModeProxy)},
			}
			if dual {
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: fmt.Sprintf("2001:db8:2::%x", i)})
			}
		}
		if (i/6)%3 == 1 {
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "2001:db8:113::/64"}
		}
	default:
		if i%9 == 3 {
			s.Spec.ExternalIPs = []string{fmt.Sprintf("198.51.100.%d", i%250), fmt.Sprintf("2001:db8:51::%x", i)}
			external = true
		}
	}
	if external && (i/6)%2 == 0 {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	if i%7 == 3 {
		s.Spec.InternalTrafficPolicy = ref(v1.ServiceInternalTrafficPolicyLocal)
	}
	if i%11 == 5 {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if i%22 == 5 {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ref(int32(300))}}
		}
	}
	switch i % 13 {
	case 4:
		s.Spec.TrafficDistribution = ref(v1.ServiceTrafficDistributionPreferClose)
	case 8:
		s.Spec.TrafficDistribution = ref(v1.ServiceTrafficDistributionPreferSameNode)
	}
	return s
}

// endpointIP is the address of endpoint j of Service i in family.
func endpointIP(family v1.IPFamily, i, j int) string {
	if family == v1.IPv6Protocol {
		return canonical(fmt.Sprintf("fd00:10:244:%x::%x", i+1, 0x10+j))
	}
	return fmt.Sprintf("10.244.%d.%d", i%250, 10+j)
}

func canonical(s string) string {
	a := netip.MustParseAddr(s)
	if a.String() != s {
		panic(fmt.Sprintf("address %q is not canonical (%s)", s, a))
	}
	return s
}

// endpointOn returns endpoint j of Service i in family on node, ready, with hints as the EndpointSlice
// controller would write them for the Service's trafficDistribution.
func endpointOn(svc *v1.Service, family v1.IPFamily, i, j int, node string) discovery.Endpoint {
	ep := discovery.Endpoint{
		Addresses: []string{endpointIP(family, i, j)},
		NodeName:  ref(node),
		Zone:      ref(nodeZones[node]),
	}
	if i%8 != 5 { // leave the conditions unset (defaults: ready, serving) on some
		ep.Conditions = discovery.EndpointConditions{Ready: ref(true), Serving: ref(true), Terminating: ref(false)}
	}
	if td := svc.Spec.TrafficDistribution; td != nil {
		ep.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: nodeZones[node]}}}
		if *td == v1.ServiceTrafficDistributionPreferSameNode {
			ep.Hints.ForNodes = []discovery.ForNode{{Name: node}}
		}
	}
	return ep
}

// slicePorts returns the slice ports for the Service's ports: same name and protocol, target 10000+port.
func slicePorts(svc *v1.Service) []discovery.EndpointPort {
	var out []discovery.EndpointPort
	for _, p := range svc.Spec.Ports {
		out = append(out, discovery.EndpointPort{Name: ref(p.Name), Protocol: ref(p.Protocol), Port: ref(10000 + p.Port)})
	}
	return out
}

// planSlices returns the EndpointSlices of Service i as created (svc as the API server returned it): one
// per IP family with three endpoints on node-a (local), node-b and node-c. When i%10==9 the third one is
// terminating (still serving).
func planSlices(svc *v1.Service, i int) []*discovery.EndpointSlice {
	var out []*discovery.EndpointSlice
	for _, family := range svc.Spec.IPFamilies {
		es := newSlice(svc, sliceName(svc.Name, family), family)
		es.Ports = slicePorts(svc)
		for j, node := range []string{"node-a", "node-b", "node-c"} {
			ep := endpointOn(svc, family, i, j, node)
			if j == 2 && i%10 == 9 {
				ep.Conditions = discovery.EndpointConditions{Ready: ref(false), Serving: ref(true), Terminating: ref(true)}
			}
			es.Endpoints = append(es.Endpoints, ep)
		}
		out = append(out, es)
	}
	return out
}

func sliceName(svc string, family v1.IPFamily) string {
	if family == v1.IPv6Protocol {
		return svc + "-v6"
	}
	return svc + "-v4"
}

// newSlice returns an empty slice of family labelled for svc, with a trigger time.
func newSlice(svc *v1.Service, name string, family v1.IPFamily) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name, Labels: map[string]string{
			discovery.LabelServiceName: svc.Name,
			discovery.LabelManagedBy:   "model-test",
		}},
		AddressType: discovery.AddressTypeIPv4,
	}
	if family == v1.IPv6Protocol {
		es.AddressType = discovery.AddressTypeIPv6
	}
	stampTrigger(es)
	return es
}
