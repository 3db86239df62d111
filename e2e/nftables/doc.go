// Package nftables holds the real-kernel end-to-end tests of mode nftables: the built kube-proxy binary
// runs inside a node network namespace against a real apiserver, pods are network namespaces running real
// TCP and UDP servers, and a client namespace reaches Services through the node (harness.Bed). The tests
// write Services, EndpointSlices and the Node themselves (there is no controller-manager), then check
// which pod answers, the source address it saw, and what `nft list table ip kube-proxy` shows: through
// restarts, reloads and endpoint churn, next to upstream kube-proxy v1.37 in mode nftables (both tables
// must read the same), across switches to and from mode iptables, after `--cleanup`, and after faults (a
// deleted table, chain or map element; kill -9 in the middle of a large first sync).
//
// Run them as root with the cluster binaries built (see e2e/README.md):
//
//	make build build-faults
//	KP_E2E=1 KP_BINARY=$PWD/bin/kube-proxy KP_FAULTS_BINARY=$PWD/bin/kube-proxy-faults go test -count=1 ./e2e/nftables/
//
// KP_NFT_LONG=1 makes TestKillDuringFirstSync use 6,000 Services instead of 1,500 and kill the daemon at
// three points of its first sync instead of one (a few minutes more).
package nftables
