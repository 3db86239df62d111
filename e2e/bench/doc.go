// Command bench measures our kube-proxy side by side with upstream kube-proxy v1.37.2 on this machine, against
// a real kube-apiserver and etcd from the e2e harness, and writes the results to BENCHMARKS.md.
//
// For each endpoint count M it starts a cluster; for each Service count N (ascending) it creates N ClusterIP
// Services with M endpoints each (in parallel, no client-side rate limit) and then, -runs times, runs each
// implementation alone in fresh node network namespaces: once with a config file both accept (minSyncPeriod
// left at its 1 s default) and once with the equivalent command-line flags plus
// --iptables-min-sync-period=0 (upstream ignores most flags next to --config and turns a 0s minSyncPeriod
// in a file into 1 s). It measures
//
//   - cold start: exec → the nf_tables transaction after which every Service's KUBE-SVC chain jumps to all
//     its endpoints' KUBE-SEP chains (chain names computed here independently: upstream's hashing);
//   - network programming latency: single-Service endpoint additions and removals on random Services, API
//     write returned → the transaction that added or removed the KUBE-SVC → KUBE-SEP jump, p50 and p99;
//   - RSS after the cold sync and after the changes, CPU (the daemon's and its iptables children's) per
//     change, rules and transactions per change;
//   - new-connection latency (connect(2) from a client namespace through the node) to the first- and
//     last-created Services, to the one whose KUBE-SVC chain most rules precede, and to a pod IP;
//   - kernel floors: iptables-nft-restore --noflush of each implementation's whole payload into an empty
//     namespace, and of one Service's own lines for an endpoint change over its full rule set.
//
// The kernel is observed, never the daemons' logs or metrics: a netlink socket in the node namespace joined
// to nf_tables' multicast group (what `nft monitor` reads) reports every chain and rule added or deleted and
// every committed transaction with the committing process.
//
// Every Service answers real connections: all endpoint addresses lie in 10.244.128.0/17, which is local in
// the one pod namespace (its server listens on the wildcard address) and routed there by the node.
//
// Run as root through `make bench` (full) or `make bench-quick` (N=1000, M=3, a few changes: checks that
// everything runs, in about a minute and a half). See -help for the flags.
package main
