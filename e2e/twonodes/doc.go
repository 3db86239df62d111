// Package twonodes holds the end-to-end tests of two nodes proxying one cluster: our kube-proxy runs in
// two node network namespaces (harness.TopologyOptions.NodeBPods), each with pods of its own and routes
// to the other's pod range, both against the same apiserver, in mode iptables and in mode nftables. Real
// connections from the client namespace and from pods on either node check what only two nodes can
// show: a NodePort of one node reaching a pod on the other (and the reply finding its way back),
// externalTrafficPolicy Local serving and health-checking on the node with local endpoints only, and
// internalTrafficPolicy Local keeping each node's pods on their own node's endpoints.
//
// Run them as root with the cluster binaries built (see e2e/README.md):
//
//	KP_E2E=1 KP_BINARY=$PWD/bin/kube-proxy go test -count=1 ./e2e/twonodes/
package twonodes
