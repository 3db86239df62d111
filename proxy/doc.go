// Package proxy is everything between the API server and a dataplane: watches of Services,
// EndpointSlices and this node, change tracking, immutable per-family snapshots of the desired state,
// endpoint selection (readiness, traffic policies, topology), the bounded-frequency sync loop, and the health
// and metrics that report on it. It knows nothing of iptables or IPVS: a dataplane implements Dataplane.
package proxy
