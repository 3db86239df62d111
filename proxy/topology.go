package proxy

import "slices"

// Selection is the outcome of endpoint selection for one Service port on one node.
type Selection struct {
	// Cluster holds the endpoints for Cluster-policy traffic; nil when the port never uses them.
	Cluster []Endpoint
	// Local holds the endpoints for Local-policy traffic; nil when the port never uses them.
	Local []Endpoint
	// HasAny reports that usable endpoints exist somewhere in the cluster.
	HasAny bool
}

// Topology modes chosen from endpoint hints.
const (
	topologyNone     = ""
	topologySameZone = "PreferSameZone"
	topologySameNode = "PreferSameNode"
)

// SelectEndpoints decides which endpoints of a Service port this node uses, with upstream's semantics:
//   - Cluster traffic uses Ready endpoints, narrowed by topology hints when every Ready endpoint carries a
//     hint and one is meant for this node (node hints first, then zone hints for the node's zone); when no
//     endpoint is Ready it falls back to endpoints that are Serving and Terminating.
//   - Local traffic (internalTrafficPolicy or externalTrafficPolicy Local) uses this node's Ready endpoints,
//     or, when it has none, this node's Serving and Terminating ones. Hints never apply to it.
//
// trafficDistribution (PreferClose, PreferSameZone, PreferSameNode) reaches kube-proxy only through the hints
// the EndpointSlice controller writes, so the Service field itself does not change the choice.
func SelectEndpoints(sp *ServicePort, endpoints []Endpoint, nodeName, zone string) Selection {
	var sel Selection
	if len(endpoints) == 0 {
		if sp.UsesClusterEndpoints() {
			sel.Cluster = []Endpoint{}
		}
		if sp.UsesLocalEndpoints() {
			sel.Local = []Endpoint{}
		}
		return sel
	}
	if sp.UsesClusterEndpoints() {
		mode := topologyMode(endpoints, nodeName, zone)
		sel.Cluster = filter(endpoints, func(e *Endpoint) bool { return e.Ready && inTopology(e, mode, nodeName, zone) })
		if len(sel.Cluster) == 0 {
			sel.Cluster = filter(endpoints, servingTerminating)
		}
		sel.HasAny = len(sel.Cluster) > 0
	}
	if sp.UsesLocalEndpoints() {
		sel.Local = filter(endpoints, func(e *Endpoint) bool { return e.IsLocal && e.Ready })
		if len(sel.Local) == 0 {
			sel.Local = filter(endpoints, func(e *Endpoint) bool { return e.IsLocal && servingTerminating(e) })
		}
		if !sel.HasAny {
			sel.HasAny = slices.ContainsFunc(endpoints, func(e Endpoint) bool { return e.Ready || servingTerminating(&e) })
		}
	}
	return sel
}

func servingTerminating(e *Endpoint) bool { return e.Serving && e.Terminating }

// topologyMode picks the hint kind to honour: same node when every Ready endpoint has node hints and one
// names this node, else same zone when every Ready endpoint has zone hints and one names this zone, else none.
func topologyMode(endpoints []Endpoint, nodeName, zone string) string {
	ready, allNode, forNode, allZone, forZone := false, true, false, true, false
	for i := range endpoints {
		e := &endpoints[i]
		if !e.Ready {
			continue
		}
		ready = true
		if len(e.NodeHints()) == 0 {
			allNode = false
		} else if slices.Contains(e.NodeHints(), nodeName) {
			forNode = true
		}
		if len(e.ZoneHints()) == 0 {
			allZone = false
		} else if slices.Contains(e.ZoneHints(), zone) {
			forZone = true
		}
	}
	switch {
	case !ready:
		return topologyNone
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

func inTopology(e *Endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.NodeHints(), nodeName)
	case topologySameZone:
		return slices.Contains(e.ZoneHints(), zone)
	}
	return true
}

// filter returns the endpoints for which keep is true, never nil. When all are kept it returns endpoints
// itself: the slices are immutable, so sharing saves a copy per Service in the common case.
func filter(endpoints []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	n := 0
	for i := range endpoints {
		if keep(&endpoints[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return []Endpoint{}
	case len(endpoints):
		return endpoints
	}
	out := make([]Endpoint, 0, n)
	for i := range endpoints {
		if keep(&endpoints[i]) {
			out = append(out, endpoints[i])
		}
	}
	return out
}
