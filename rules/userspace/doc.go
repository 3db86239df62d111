// Package userspace is mode userspace, the seed design's third mode (upstream removed it in v1.26; here it
// is this project's extension): the daemon itself proxies every Service port with the engine of package
// engine, and iptables rules in the node's backend capture new connections to the Service's addresses and
// redirect them to the engine's listeners.
//
// Chains (nat): KUBE-PORTALS-CONTAINER and KUBE-NODEPORT-CONTAINER from PREROUTING (traffic from pods and
// other hosts), KUBE-PORTALS-HOST and KUBE-NODEPORT-HOST from OUTPUT (traffic from the node itself); the
// NodePort chains are entered only for destinations that are local addresses. Each rule matches one
// destination (cluster IP, external IP, load-balancer IP, or a node address for NodePorts), protocol and
// port, and REDIRECTs to the listener's port. (filter): KUBE-PORTALS-FILTER, from INPUT, FORWARD and
// OUTPUT for new connections, rejects traffic to a Service port without endpoints and drops what
// loadBalancerSourceRanges keep out, as the other modes do. Redirected connections (conntrack state DNAT)
// return from it at once.
//
// Endpoints are those chosen in proxy/ (ready and serving-terminating fallback, traffic policies,
// topology): a Service port gets a listener per selection it uses, "cluster" or "local". Traffic under
// externalTrafficPolicy Local that comes from the node itself or from a local pod goes to the cluster
// selection, as upstream's rules send it.
//
// The chains are rewritten whole at every sync, in one iptables-restore --noflush; listeners are opened
// before the rules that point at them, and closed after the rules no longer do.
package userspace
