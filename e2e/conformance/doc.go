// Command conformance is `make conformance`: upstream's own e2e tests for Services, run against this
// kube-proxy on a real three-node cluster on this machine, and against upstream's kube-proxy on the
// same bed, with docs/CONFORMANCE.md written from the results.
//
// The bed: a lab network namespace holds a bridge, etcd, the apiserver, the controller-manager, the
// scheduler, CoreDNS (behind the kube-dns Service) and the test runner; each node is a network
// namespace on that bridge with its own containerd, kubelet (cgroup v1, its own cgroup root) and CNI
// bridge. Images are built without a registry (package images). The host's own links, addresses,
// routes and rules are never touched; every process runs in a cgroup of the lab's, so teardown (also
// of a crashed earlier run) finds them all and stops them by PID.
//
// Each run (impl/mode/way) starts a kube-proxy on both nodes — ours or upstream's, as a process the
// hard way or as the DaemonSet of packaging/kubernetes — runs the tests with the ginkgo CLI, records
// the JUnit report, then stops it and removes its rules with --cleanup. See docs/TESTING.md for what it needs
// and how long it takes.
package main
