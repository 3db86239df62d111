// Package ipvsvm runs IPVS mode against a real IPVS kernel. This machine's kernel has no IP_VS, so the
// tests boot Debian's stock kernel (the linux-image-amd64 of the host's apt sources, downloaded with
// apt-get and cached under CacheDir) under qemu's software emulation, with a throw-away initramfs holding
// busybox, the host's iproute2, ipvsadm, ipset, kmod and iptables-nft, the kernel's netfilter, IPVS and
// ipset modules, a static guest agent (./guest) and the daemon.
//
// One boot runs every case: the agent makes pod and client network namespaces inside the VM, drives
// rules/ipvs through the scenarios with real TCP and UDP traffic (cluster IP and node port reachability,
// rr, sh, dh, lc, sed, nq, mh and the kernel's other schedulers, session affinity, graceful termination,
// external IPs, source ranges, Local traffic policies, repair of changes made behind its back, one client
// port to two virtual servers of one pod, IPv6, sysctls and timeouts, cleanup), then runs the daemon in IPVS mode against the apiserver the test started
// on the host (qemu's user networking makes the host's loopback 10.0.2.2), and reports on the serial
// console (see Prefix). TestIPVSInVM turns each reported case into a subtest; the console log of every run
// is kept under CacheDir()/run.
//
// Environment:
//
//	KP_E2E=1            run (the tests skip without it, and fail naming what is missing with it)
//	KP_VM_CASES=a,b     only these cases ("daemon" for the daemon part)
//	KP_VM_CONSOLE=1     copy the VM's console into the test log
//	KP_VM_KERNEL=ABI    boot this Debian kernel (e.g. 6.1.0-57-amd64) instead of linux-image-amd64's
//	KP_BINARY=path      the daemon binary (default: built from the module root)
//	KP_IPVS_BENCH=N     TestIPVSSyncBenchmark, in a boot of its own: upstream kube-proxy v1.37.2 (from
//	                    KP_CLUSTER_BINDIR) and ours in IPVS mode, one after the other, on N Services x 3
//	                    endpoints of this host's apiserver, observed in the guest; then the IPVS writer's
//	                    own benchmark (N virtual servers x 3 real servers)
//	KP_IPVS_BENCH_RUNS=3, KP_IPVS_BENCH_CHANGES=10, KP_IPVS_BENCH_IMPLS=upstream,ours   its knobs
package ipvsvm
