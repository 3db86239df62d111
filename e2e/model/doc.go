// Package model is the end-to-end test of the Service model (proxy/) against a real kube-apiserver: the
// proxy runs in this process as system:kube-proxy, with recording dataplanes in place of iptables or IPVS,
// while the test writes Services, EndpointSlices and its Node, mutates them in batches, restarts and kills
// the apiserver, and writes malformed objects the apiserver accepts. After each step the snapshots the
// dataplanes received must equal an expectation the test computes on its own from what it wrote, with
// upstream kube-proxy's semantics.
//
// Run it with KP_E2E=1 go test -count=1 ./e2e/model/ (it needs the cluster binaries; see e2e/README.md).
// Without KP_E2E only the unit tests of the expectation and of the recording dataplane run.
package model
