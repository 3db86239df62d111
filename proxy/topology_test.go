package proxy

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tep builds an endpoint for selection tests from "ip:port" and flags.
type tep struct {
	addr                        string
	ready, serving, terminating bool
	local                       bool
	zones, nodes                []string
}

func (e tep) endpoint() Endpoint {
	ap := netip.MustParseAddrPort(e.addr)
	ep := NewEndpoint(ap.Addr(), int32(ap.Port()))
	ep.Ready, ep.Serving, ep.Terminating, ep.IsLocal = e.ready, e.serving, e.terminating, e.local
	// Ready implies Serving in real EndpointSlices.
	ep.Serving = ep.Serving || ep.Ready
	if e.zones != nil || e.nodes != nil {
		ep.Hints = &Hints{Zones: e.zones, Nodes: e.nodes}
	}
	return ep
}

func z(zs ...string) []string { return zs }

// none is an empty but used endpoint list (nil means "this traffic policy is not used").
var none = []string{}

// TestSelectEndpoints carries the facts of upstream's CategorizeEndpoints table (pkg/proxy/topology_test.go,
// v1.37.2, where PreferSameTrafficDistribution is GA), plus a few more. cluster/local nil mean the port never
// uses that kind of endpoint; an empty list means it does but has none.
func TestSelectEndpoints(t *testing.T) {
	tests := []struct {
		name     string
		sp       ServicePort
		nodeName string
		zone     string
		eps      []tep
		cluster  []string
		local    []string
		hasAny   bool
	}{
		{
			name: "zone hints used: all ready endpoints hinted, some for this zone",
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
			hasAny:  true,
		},
		{
			name: "ETP Local: hints narrow cluster endpoints but never local ones",
			sp:   ServicePort{ExternalPolicyLocal: true, NodePort: 8080},
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, local: true, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, local: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
			local:   []string{"10.1.2.3:80", "10.1.2.4:80"},
			hasAny:  true,
		},
		{
			name: "ITP Local on an externally accessible port: hints ignored for local endpoints",
			sp:   ServicePort{InternalPolicyLocal: true, NodePort: 8080},
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, local: true, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, local: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
			local:   []string{"10.1.2.3:80", "10.1.2.4:80"},
			hasAny:  true,
		},
		{
			name:    "node without a zone label: hints ignored",
			zone:    "",
			eps:     []tep{{addr: "10.1.2.3:80", ready: true, zones: z("zone-a")}},
			cluster: []string{"10.1.2.3:80"},
			hasAny:  true,
		},
		{
			name:    "node in a zone nobody is hinted for: no filtering",
			zone:    "zone-b",
			eps:     []tep{{addr: "10.1.2.3:80", ready: true, zones: z("zone-a")}},
			cluster: []string{"10.1.2.3:80"},
			hasAny:  true,
		},
		{
			name: "unready endpoints are not used, hinted or not",
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c")},
				{addr: "10.1.2.6:80", ready: false, zones: z("zone-a")},
			},
			cluster: []string{"10.1.2.3:80"},
			hasAny:  true,
		},
		{
			name: "only unready endpoints hinted for this zone: no filtering",
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: false, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c")},
				{addr: "10.1.2.6:80", ready: false, zones: z("zone-a")},
			},
			cluster: []string{"10.1.2.4:80", "10.1.2.5:80"},
			hasAny:  true,
		},
		{
			name: "a ready endpoint without hints disables zone filtering",
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: true},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"},
			hasAny:  true,
		},
		{
			name: "an unready endpoint without hints does not disable zone filtering",
			zone: "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b")},
				{addr: "10.1.2.5:80", ready: false},
			},
			cluster: []string{"10.1.2.3:80"},
			hasAny:  true,
		},
		{
			name: "several zone hints per endpoint",
			zone: "zone-c",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a", "zone-b", "zone-c")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b", "zone-c")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-b", "zone-d")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-c")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"},
			hasAny:  true,
		},
		{
			name:     "node hints win over zone hints when one names this node",
			nodeName: "node-1",
			zone:     "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a"), nodes: z("node-1")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b"), nodes: z("node-2")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c"), nodes: z("node-3")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a"), nodes: z("node-4")},
			},
			cluster: []string{"10.1.2.3:80"},
			hasAny:  true,
		},
		{
			name:     "node hints ignored (and zone hints too) when a ready endpoint has no hints",
			nodeName: "node-1",
			zone:     "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a"), nodes: z("node-1")},
				{addr: "10.1.2.4:80", ready: true},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c"), nodes: z("node-3")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a"), nodes: z("node-4")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"},
			hasAny:  true,
		},
		{
			name:     "node hints fall back to zone hints when none names this node",
			nodeName: "node-0",
			zone:     "zone-a",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, zones: z("zone-a"), nodes: z("node-1")},
				{addr: "10.1.2.4:80", ready: true, zones: z("zone-b"), nodes: z("node-2")},
				{addr: "10.1.2.5:80", ready: true, zones: z("zone-c"), nodes: z("node-3")},
				{addr: "10.1.2.6:80", ready: true, zones: z("zone-a"), nodes: z("node-4")},
			},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
			hasAny:  true,
		},
		{
			name:     "node hints without zone hints: same node only",
			nodeName: "node-2",
			eps: []tep{
				{addr: "10.1.2.3:80", ready: true, nodes: z("node-1")},
				{addr: "10.1.2.4:80", ready: true, nodes: z("node-2")},
			},
			cluster: []string{"10.1.2.4:80"},
			hasAny:  true,
		},
		{
			name: "topology and localness conflict: both lists kept apart",
			sp:   ServicePort{ExternalPolicyLocal: true, NodePort: 8080},
			zone: "zone-a",
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true, local: true, zones: z("zone-a")},
				{addr: "10.0.0.1:80", ready: true, local: true, zones: z("zone-b")},
				{addr: "10.0.0.2:80", ready: true, zones: z("zone-a")},
				{addr: "10.0.0.3:80", ready: true, zones: z("zone-b")},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.2:80"},
			local:   []string{"10.0.0.0:80", "10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name:  "ITP Local with no endpoints",
			sp:    ServicePort{InternalPolicyLocal: true},
			local: none,
		},
		{
			name: "ITP Local, all endpoints remote: none usable here, but some exist",
			sp:   ServicePort{InternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			local:  none,
			hasAny: true,
		},
		{
			name: "ITP Local, all endpoints local",
			sp:   ServicePort{InternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true, local: true},
				{addr: "10.0.0.1:80", ready: true, local: true},
			},
			local:  []string{"10.0.0.0:80", "10.0.0.1:80"},
			hasAny: true,
		},
		{
			name: "ITP Local, some endpoints local",
			sp:   ServicePort{InternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true, local: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			local:  []string{"10.0.0.0:80"},
			hasAny: true,
		},
		{
			name: "Cluster policy, no endpoint ready (and none terminating)",
			eps: []tep{
				{addr: "10.0.0.0:80"},
				{addr: "10.0.0.1:80"},
			},
			cluster: none,
		},
		{
			name: "Cluster policy, some endpoints ready",
			eps: []tep{
				{addr: "10.0.0.0:80"},
				{addr: "10.0.0.1:80", ready: true},
			},
			cluster: []string{"10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name: "Cluster policy, all endpoints serving and terminating: fall back to them",
			eps: []tep{
				{addr: "10.0.0.0:80", serving: true, terminating: true, local: true},
				{addr: "10.0.0.1:80", serving: true, terminating: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name: "Cluster policy: terminating endpoints that no longer serve are never used",
			eps: []tep{
				{addr: "10.0.0.0:80", terminating: true},
				{addr: "10.0.0.1:80", serving: true, terminating: true},
			},
			cluster: []string{"10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name: "Cluster policy: ready endpoints beat serving-terminating ones",
			eps: []tep{
				{addr: "10.0.0.0:80", serving: true, terminating: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			cluster: []string{"10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name: "ITP Local, ETP Cluster, some endpoints local",
			sp:   ServicePort{InternalPolicyLocal: true, NodePort: 8080},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true, local: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			local:   []string{"10.0.0.0:80"},
			hasAny:  true,
		},
		{
			name: "ITP Cluster, ETP Local, some endpoints local",
			sp:   ServicePort{ExternalPolicyLocal: true, NodePort: 8080},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true, local: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			local:   []string{"10.0.0.0:80"},
			hasAny:  true,
		},
		{
			name: "ITP Local, ETP Local, some endpoints local",
			sp:   ServicePort{InternalPolicyLocal: true, ExternalPolicyLocal: true, NodePort: 8080},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true, local: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			local:   []string{"10.0.0.0:80"},
			hasAny:  true,
		},
		{
			name: "ITP Local, ETP Local, all endpoints remote",
			sp:   ServicePort{InternalPolicyLocal: true, ExternalPolicyLocal: true, NodePort: 8080},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
				{addr: "10.0.0.1:80", ready: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			local:   none,
			hasAny:  true,
		},
		{
			name: "ITP Local, ETP Local, all endpoints remote and terminating",
			sp:   ServicePort{InternalPolicyLocal: true, ExternalPolicyLocal: true, NodePort: 8080},
			eps: []tep{
				{addr: "10.0.0.0:80", serving: true, terminating: true},
				{addr: "10.0.0.1:80", serving: true, terminating: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			local:   none,
			hasAny:  true,
		},
		{
			name: "ITP Local only, all endpoints remote and terminating: some exist elsewhere",
			sp:   ServicePort{InternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", serving: true, terminating: true},
			},
			local:  none,
			hasAny: true,
		},
		{
			name: "ITP Local only, endpoints neither ready nor serving: none anywhere",
			sp:   ServicePort{InternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", local: true},
				{addr: "10.0.0.1:80", terminating: true},
			},
			local: none,
		},
		{
			name: "ITP Cluster, ETP Local, local fallback to serving-terminating independently of cluster",
			sp:   ServicePort{ExternalPolicyLocal: true, NodePort: 8080},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
				{addr: "10.0.0.1:80", local: true},
				{addr: "10.0.0.2:80", serving: true, terminating: true, local: true},
				{addr: "10.0.0.3:80", serving: true, terminating: true},
			},
			cluster: []string{"10.0.0.0:80"},
			local:   []string{"10.0.0.2:80"},
			hasAny:  true,
		},
		{
			name: "ETP Local ignored when the port is not externally accessible",
			sp:   ServicePort{ExternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
				{addr: "10.0.0.1:80", ready: true, local: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name: "ETP Local counts when externally accessible through external IPs only",
			sp:   ServicePort{ExternalPolicyLocal: true, ExternalIPs: addrs("192.0.2.1")},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
				{addr: "10.0.0.1:80", ready: true, local: true},
			},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"},
			local:   []string{"10.0.0.1:80"},
			hasAny:  true,
		},
		{
			name: "ETP Local counts when externally accessible through load-balancer IPs only",
			sp:   ServicePort{ExternalPolicyLocal: true, LoadBalancerIPs: addrs("192.0.2.1")},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
			},
			cluster: []string{"10.0.0.0:80"},
			local:   none,
			hasAny:  true,
		},
		{
			name: "ITP Local internal-only Service uses no cluster endpoints",
			sp:   ServicePort{InternalPolicyLocal: true},
			eps: []tep{
				{addr: "10.0.0.0:80", ready: true},
				{addr: "10.0.0.1:80", ready: true, local: true},
			},
			local:  []string{"10.0.0.1:80"},
			hasAny: true,
		},
		{
			name:    "no endpoints at all",
			cluster: none,
		},
		{
			name:    "no endpoints at all, externally accessible with ETP Local",
			sp:      ServicePort{ExternalPolicyLocal: true, NodePort: 30000},
			cluster: none,
			local:   none,
		},
		{
			name:    "one endpoint neither ready, serving nor terminating",
			zone:    "zone-a",
			eps:     []tep{{addr: "10.0.0.0:80"}},
			cluster: none,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var eps []Endpoint
			for _, e := range tc.eps {
				eps = append(eps, e.endpoint())
			}
			sp := tc.sp
			sel := SelectEndpoints(&sp, eps, tc.nodeName, tc.zone)
			if diff := cmp.Diff(tc.cluster, epAddrs(sel.Cluster)); diff != "" {
				t.Errorf("cluster endpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.local, epAddrs(sel.Local)); diff != "" {
				t.Errorf("local endpoints (-want +got):\n%s", diff)
			}
			if sel.HasAny != tc.hasAny {
				t.Errorf("HasAny = %v, want %v", sel.HasAny, tc.hasAny)
			}
		})
	}
}

// TestSelectEndpointsKeepsInputIntact checks that selection never writes into the (shared, immutable)
// endpoint slice it is given.
func TestSelectEndpointsKeepsInputIntact(t *testing.T) {
	eps := []Endpoint{
		tep{addr: "10.0.0.1:80", ready: true, zones: z("zone-b")}.endpoint(),
		tep{addr: "10.0.0.2:80", ready: true, local: true, zones: z("zone-a")}.endpoint(),
		tep{addr: "10.0.0.3:80", serving: true, terminating: true, local: true, zones: z("zone-a")}.endpoint(),
	}
	before := append([]Endpoint(nil), eps...)
	sp := ServicePort{ExternalPolicyLocal: true, NodePort: 30000}
	sel := SelectEndpoints(&sp, eps, "n", "zone-a")
	if diff := cmp.Diff(before, eps, netipCmp); diff != "" {
		t.Errorf("input changed (-before +after):\n%s", diff)
	}
	if len(sel.Cluster) != 1 || len(sel.Local) != 1 {
		t.Errorf("unexpected selection %v / %v", epAddrs(sel.Cluster), epAddrs(sel.Local))
	}
}
