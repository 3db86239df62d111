// Package nftables is mode nftables: upstream kube-proxy v1.37's `kube-proxy` table (families ip and
// ip6), with its base chains, hooks and priorities, its chains, sets and maps, upstream's hashed
// per-Service names and its rule shapes, so that `nft list table ip kube-proxy` reads the same whichever
// of the two wrote it and a node can switch between them in either direction.
//
// The renderer (render.go) is a pure function from a snapshot, the configuration and a few node facts
// (the local-traffic detector, the primary IP, the NodePort addresses, the ServiceCIDRs) to the table's
// objects: the base objects, and for each Service port its own chains and affinity sets and the elements
// it puts in the shared sets and maps. The planner (plan.go) turns them into transactions: against a
// mirror of what was written (state.go) for partial syncs, which write only the Service ports that
// changed and only what differs; or, when what the kernel holds is unknown, into a rebuild read from
// the kernel and written in transactions that each leave a working table. A chain whose old rule picks an
// endpoint through an anonymous map is not flushed and refilled: its new rules are inserted ahead of the
// old ones, which are deleted (by handle) a second later, since the kernel makes a deleted rule's map
// miss for packets already on their way through it (plan.supersede). The shared elements are
// reference-counted, so two ports wanting the same element (two ports of one cluster IP) do not remove
// it from each other.
//
// The writer (netlink_linux.go, encode_linux.go) sends the transactions as nf_tables netlink batches,
// with the expressions and user data nft 1.0 sends for the same commands (knft.go runs the same
// transactions through knftables: its Fake in unit tests, the nft command in the kernel tests that
// compare both writers' tables). Why not nft: each `nft -f` lists the whole table first, which at 10,000
// Services costs 150 ms or more for a one-Service change.
//
// Deliberate differences from upstream, none visible in `nft list table`:
//   - Anonymous sets (the per-Service numgen maps, source ranges) are named by the writer (__map1048577)
//     instead of by the kernel (__map0): the kernel's naming scans every set of the table, which made a
//     cold start quadratic in the number of Services.
//   - Partial syncs read nothing from the kernel: upstream lists every chain and set at every sync. The
//     periodic sync compares the table with the mirror instead and rebuilds it when someone changed it.
//   - The whole table is rewritten at start, after a failure and after a detected change, but not hourly
//     as upstream does: that rewrite recreates every Service's anonymous set, which costs the kernel time
//     quadratic in the number of Services (11 s at 10,000), where the periodic check costs 0.2 s. A
//     deleted table is noticed within two seconds by a watcher; upstream notices at its next change or
//     hourly.
//   - When two Services claim the same map key (an externalIP:port in both), the one first by name wins;
//     upstream's winner depends on map iteration order.
//
// With the KubeProxyNFTablesLocalhostNodePorts gate on (KEP-6032, alpha), loopback NodePorts are rejected
// and counted, but TCP ones when nodePortAddresses lists loopback explicitly: those are served, as upstream's
// alpha serves them, by a userspace proxy listening on 127.0.0.1:<nodePort> (::1), here the engine of mode
// userspace (rules/engine; localhost.go).
package nftables
