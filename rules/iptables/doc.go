// Package iptables renders kube-proxy's iptables mode: a pure function from a proxy.Snapshot and a Config to
// the iptables-restore input for the filter and nat tables, rule for rule what upstream kube-proxy v1.37
// writes, so a node can switch between the two in either direction.
//
// The renderer never touches the kernel. It keeps caches between calls (chain names, the rules each Service
// contributes to the shared chains) so that a partial render for a few changed Services costs little more
// than copying bytes. The restore writer feeds the payload to `iptables-restore --noflush`; the jump rules
// from the built-in chains (JumpRules) and the canary chains (CanaryChains) are ensured separately, as
// upstream does, and so are upstream's nfacct counters (Dataplane), which the rules name when the kernel
// has them: the INVALID drop and a copy of each NodePort rule for 127.0.0.0/8 count the packets that
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total and
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total report.
//
// Deliberate differences from upstream, none visible to traffic:
//   - Rules are grouped by chain and Services are written in name order, where upstream follows Go map
//     order. The kernel keeps the order within each chain, which is all that matters.
//   - nodePortAddresses CIDRs are matched with "-d CIDR -m addrtype --dst-type LOCAL" instead of one rule per
//     interface address found at sync time: the same packets, without reading interfaces in a pure renderer,
//     and it follows address changes without a resync. The "primary" keyword yields "-d nodeIP" as upstream.
package iptables
