// Package iptables holds the real-kernel end-to-end tests of mode iptables: the built kube-proxy binary
// runs inside a node network namespace against a real apiserver, pods are network namespaces running real
// TCP and UDP servers, and a client namespace reaches Services through the node. The tests write Services,
// EndpointSlices and the Node themselves (there is no controller-manager), then check which pod answers,
// the source address it saw, and what iptables-save shows, with both iptables backends, after faults, and
// next to upstream kube-proxy.
//
// Run them as root with the cluster binaries built (see e2e/README.md):
//
//	KP_E2E=1 KP_BINARY=$PWD/bin/kube-proxy go test -count=1 ./e2e/iptables/
package iptables
