// Command bench measures our kube-proxy side by side with upstream kube-proxy v1.37.2 on this machine, against
// a real kube-apiserver and etcd from the e2e harness, and writes the results to BENCHMARKS.md.
//
// For each endpoint count M it starts a cluster; for each Service count N (ascending) it creates N ClusterIP
// Services with M endpoints each (in parallel, no client-side rate limit) and then, -runs times, for each
// proxy mode (-mode: iptables, nftables) runs each implementation alone in fresh node network namespaces:
// once with a config file both accept (minSyncPeriod left at its 1 s default) and once with the equivalent
// command-line flags plus --iptables-min-sync-period=0 (upstream ignores most flags next to --config and
// turns a 0s minSyncPeriod in a file into 1 s; that flag sets mode nftables' minSyncPeriod too). It
// measures
//
//   - cold start: exec → the nf_tables transaction after which every Service's KUBE-SVC chain jumps to all
//     its endpoints' KUBE-SEP chains (chain names computed here independently: upstream's hashing); in mode
//     nftables, after which every Service's service-ips element sends its cluster IP to a chain whose DNAT
//     reaches all its endpoints;
//   - network programming latency: single-Service endpoint additions and removals on random Services, API
//     write returned → the transaction that added or removed the KUBE-SVC → KUBE-SEP jump (mode nftables:
//     after which the Service's chain reaches the new endpoint set), p50 and p99;
//   - RSS after the cold sync and after the changes, CPU (the daemon's and its iptables or nft children's)
//     per change, rules, set elements and transactions per change;
//   - new-connection latency (connect(2) from a client namespace through the node) to the first- and
//     last-created Services, to a pod IP, in mode iptables to the one whose KUBE-SVC chain most rules
//     precede, and in mode nftables through another node with no rules at all, in the same rounds;
//   - kernel floors: iptables-nft-restore --noflush of each implementation's whole payload into an empty
//     namespace, and of one Service's own lines for an endpoint change over its full rule set; in mode
//     nftables one `nft -f` of the table an implementation listed, and over it `nft -f` of the transaction
//     upstream's writer makes for one Service's endpoint change; new connections through a node with no
//     rules.
//
// The kernel is observed, never the daemons' logs or metrics: a netlink socket in the node namespace joined
// to nf_tables' multicast group (what `nft monitor` reads) reports every chain, rule, set and set element
// added or deleted and every committed transaction with the committing process. A cold start of mode
// nftables still unfinished after -cold-cap (20 minutes) is reported with the time and the Services it had
// reached.
//
// Every Service answers real connections: all endpoint addresses lie in 10.244.128.0/17, which is local in
// the one pod namespace (its server listens on the wildcard address) and routed there by the node.
//
// Run as root through `make bench` (full) or `make bench-quick` (N=1000, M=3, a few changes, both modes:
// checks that everything runs, in about two and a half minutes). See -help for the flags.
package main
