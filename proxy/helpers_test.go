package proxy

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

// makeService returns a ClusterIP Service ns/name with the given cluster IP (single-stack, ipFamilies set
// from the address) and ports "name:port/proto", after applying tweaks.
func makeService(ns, name, clusterIP string, tweaks ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Spec: v1.ServiceSpec{
			Type:      v1.ServiceTypeClusterIP,
			ClusterIP: clusterIP,
		},
	}
	if ip, err := netip.ParseAddr(clusterIP); err == nil {
		svc.Spec.ClusterIPs = []string{clusterIP}
		svc.Spec.IPFamilies = []v1.IPFamily{ipFamily(ip)}
	}
	for _, tw := range tweaks {
		tw(svc)
	}
	return svc
}

// withPort adds a Service port.
func withPort(name string, proto v1.Protocol, port, nodePort int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort})
	}
}

// dualStack sets ipFamilies and clusterIPs (primary first).
func dualStack(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.ClusterIP = ips[0]
		s.Spec.ClusterIPs = ips
		s.Spec.IPFamilies = nil
		for _, ip := range ips {
			s.Spec.IPFamilies = append(s.Spec.IPFamilies, ipFamily(netip.MustParseAddr(ip)))
		}
	}
}

// epSpec describes one endpoint of a test slice.
type epSpec struct {
	ip          string
	ready       *bool
	serving     *bool
	terminating *bool
	node        string
	zone        string
	zoneHints   []string
	nodeHints   []string
}

// slicePortSpec describes one port of a test slice; a nil port or protocol is left unset.
type slicePortSpec struct {
	name  *string
	port  *int32
	proto *v1.Protocol
}

func sp(name string, port int32, proto v1.Protocol) slicePortSpec {
	return slicePortSpec{name: ptr(name), port: ptr(port), proto: ptr(proto)}
}

// makeSlice returns an EndpointSlice of Service ns/svc.
func makeSlice(ns, svc, name string, at discovery.AddressType, ports []slicePortSpec, eps ...epSpec) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, ResourceVersion: "1",
			Labels: map[string]string{discovery.LabelServiceName: svc},
		},
		AddressType: at,
	}
	for _, p := range ports {
		es.Ports = append(es.Ports, discovery.EndpointPort{Name: p.name, Port: p.port, Protocol: p.proto})
	}
	for _, e := range eps {
		d := discovery.Endpoint{
			Conditions: discovery.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating},
		}
		if e.ip != "" {
			d.Addresses = []string{e.ip}
		}
		if e.node != "" {
			d.NodeName = ptr(e.node)
		}
		if e.zone != "" {
			d.Zone = ptr(e.zone)
		}
		if e.zoneHints != nil || e.nodeHints != nil {
			d.Hints = &discovery.EndpointHints{}
			for _, z := range e.zoneHints {
				d.Hints.ForZones = append(d.Hints.ForZones, discovery.ForZone{Name: z})
			}
			for _, n := range e.nodeHints {
				d.Hints.ForNodes = append(d.Hints.ForNodes, discovery.ForNode{Name: n})
			}
		}
		es.Endpoints = append(es.Endpoints, d)
	}
	return es
}

// makeNode returns a Node with the given addresses ("InternalIP=1.2.3.4"), pod CIDRs and zone.
func makeNode(name, zone string, addrs []string, podCIDRs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if zone != "" {
		n.Labels[v1.LabelTopologyZone] = zone
	}
	for _, a := range addrs {
		typ, addr, _ := strings.Cut(a, "=")
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeAddressType(typ), Address: addr})
	}
	n.Spec.PodCIDRs = podCIDRs
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
	}
	return n
}

func nn(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

func spn(ns, name, port string, proto v1.Protocol) ServicePortName {
	return ServicePortName{NamespacedName: nn(ns, name), Port: port, Protocol: proto}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// epAddrs returns the Addr of each endpoint, in order.
func epAddrs(eps []Endpoint) []string {
	if eps == nil {
		return nil
	}
	out := make([]string, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.Addr)
	}
	return out
}

// problemLog collects what a Tracker reports as skipped.
type problemLog struct {
	mu    sync.Mutex
	kinds []string
}

func (p *problemLog) sink(kind string) {
	p.mu.Lock()
	p.kinds = append(p.kinds, kind)
	p.mu.Unlock()
}

func (p *problemLog) count(kind string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, k := range p.kinds {
		if k == kind {
			n++
		}
	}
	return n
}

// dumpSnapshot renders a snapshot as stable, readable text for golden files.
func dumpSnapshot(s *Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "family %s\n", s.Family)
	fmt.Fprintf(&b, "node %s known=%v zone=%q ips=%v podCIDRs=%v\n", s.Node.Name, s.Node.Known, s.Node.Zone, s.Node.IPs, s.Node.PodCIDRs)
	for _, p := range s.Sorted() {
		fmt.Fprintf(&b, "\n%s %s\n", p.Name, p.Protocol)
		fmt.Fprintf(&b, "  clusterIP %s port %d nodePort %d\n", p.ClusterIP, p.Port, p.NodePort)
		if len(p.ExternalIPs) > 0 {
			fmt.Fprintf(&b, "  externalIPs %v\n", p.ExternalIPs)
		}
		if len(p.LoadBalancerIPs) > 0 {
			fmt.Fprintf(&b, "  loadBalancerIPs %v\n", p.LoadBalancerIPs)
		}
		if len(p.LoadBalancerSourceRanges) > 0 {
			fmt.Fprintf(&b, "  sourceRanges %v\n", p.LoadBalancerSourceRanges)
		}
		fmt.Fprintf(&b, "  sticky %d etpLocal %v itpLocal %v hcNodePort %d trafficDistribution %q\n",
			p.StickyMaxAgeSeconds, p.ExternalPolicyLocal, p.InternalPolicyLocal, p.HealthCheckNodePort, p.TrafficDistribution)
		for _, e := range p.Endpoints {
			fmt.Fprintf(&b, "  ep %s ready=%v serving=%v terminating=%v node=%q zone=%q local=%v zoneHints=%v nodeHints=%v\n",
				e.Addr, e.Ready, e.Serving, e.Terminating, e.NodeName, e.Zone, e.IsLocal, e.ZoneHints(), e.NodeHints())
		}
		fmt.Fprintf(&b, "  cluster %v\n  local %v\n  hasAny %v\n", fmtList(p.ClusterEndpoints), fmtList(p.LocalEndpoints), p.HasAnyEndpoints)
	}
	return b.String()
}

func fmtList(eps []Endpoint) string {
	if eps == nil {
		return "<unused>"
	}
	return "[" + strings.Join(epAddrs(eps), " ") + "]"
}

// golden compares got with testdata/name, rewriting it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run with -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs from the golden file (-want +got; -update to accept):\n%s", path, diff)
	}
}

// eventually polls cond until it holds or the test's deadline approaches. It never asserts on durations:
// it only bounds how long a broken implementation can hang the test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := t.Deadline(); ok && time.Until(d) < 35*time.Second {
		deadline = d.Add(-5 * time.Second)
	}
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
