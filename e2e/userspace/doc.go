// Package userspace holds the end-to-end tests of mode userspace: the daemon runs in a node network
// namespace against a real kube-apiserver, proxies real TCP and UDP traffic from a client namespace, the
// node itself and pod namespaces to pod servers, and its capture rules are read back from the kernel.
// The expectations are written here, per case, without the daemon's code.
package userspace
