// Package harness is the project's real-cluster and real-kernel test bed.
//
// It starts a real etcd and kube-apiserver on loopback (built from the Go module proxy by
// e2e/tools/build-cluster.sh), creates network namespaces wired as a node with pods and a client
// (Topology; with TopologyOptions.NodeBPods, two nodes and a client on one bridged network, each node
// with pods of its own and routes to the other's), runs a small server of ours in every pod
// (e2e/podserver), makes real TCP/UDP connections and counts which pod answered (Hit), and supervises
// daemons under test (Process, NotifySocket).
//
// A proxy mode's end-to-end suite builds on Bed (a topology, a namespace and a Node of the test's own,
// Services and EndpointSlices written for it), keeps traffic flowing through changes (Traffic), checks
// what every mode must make true (ExpectClusterIP, ExpectExternalTrafficPolicyLocal, ...), and reads the
// kernel's rules: iptables-save (ParseSave) or nft listings (ParseNFT, NFTTable.Normalized, which
// compares two listings of one table regardless of the order of its elements and blocks).
//
// Everything that touches the kernel happens inside network namespaces the harness creates (names
// start with "kpt-"); the root network namespace's rules, routes, addresses and sysctls are never
// changed. Every process the harness starts is ended by PID.
//
// Tests that need root or the cluster binaries call Require (or ForTest / SharedCluster, which call
// it): they are skipped when KP_E2E is unset and fail, naming what is missing, when KP_E2E is set.
//
// Most of the package is Linux-only; on other systems only the portable helpers build.
package harness
