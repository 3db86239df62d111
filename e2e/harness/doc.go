// Package harness is the project's real-cluster and real-kernel test bed.
//
// It starts a real etcd and kube-apiserver on loopback (built from the Go module proxy by
// e2e/tools/build-cluster.sh), creates network namespaces wired as a node with pods and a client
// (Topology), runs a small server of ours in every pod (e2e/podserver), makes real TCP/UDP
// connections and counts which pod answered (Hit), and supervises daemons under test (Process,
// NotifySocket).
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
