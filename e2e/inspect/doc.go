// Package inspect tests the operator commands (`kube-proxy trace`, `diff`, `doctor`) end to end: a real
// apiserver, the daemon in a node namespace in mode iptables and in mode nftables, pods serving, and the
// commands run in that namespace against the live kernel. Each trace verdict is checked against real
// traffic sent the same way; then the node is broken one thing at a time and diff and doctor must name
// each breakage, and the fix they suggest must clear it.
package inspect
