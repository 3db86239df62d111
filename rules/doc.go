// Package rules programs the kernel for the proxy: New builds the dataplane of the configured mode for
// every IP family the node can serve, and Cleanup removes everything this daemon (or upstream kube-proxy)
// installed. The renderers are pure functions of a snapshot and the configuration (rules/iptables,
// rules/ipvs); the writers around them are thin (rules/xtables runs iptables-restore, rules/conntrack
// cleans stale UDP and SCTP flows).
package rules
