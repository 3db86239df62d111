// Package systemdlab boots Debian with a real systemd as PID 1 in systemd-nspawn, each machine in a network
// namespace of its own, and runs the install guide (docs/INSTALL.md), the unit and the .deb against it.
//
// A machine boots from a cached debootstrap root file system (rootfs.sh; built once per machine and suite,
// under ~/.cache/kube-proxy-e2e/systemd-lab) with --volatile=overlay, so every boot starts from the same
// pristine tree and nothing a test does survives it. --private-network gives it only a loopback: iptables
// inside never touches the host's rules. The test's real API server is made reachable inside at
// 127.0.0.1:6443 through the harness's bridge (harness.Cluster.BridgeAt on the machine's namespace).
//
// Commands run inside through nsenter into the machine's namespaces, so `systemctl` and `journalctl` talk
// to the machine's own systemd. The suites are bookworm (systemd 252, no Type=notify-reload) and trixie
// (systemd 257).
//
// The tests skip without KP_E2E and fail, naming what is missing, with KP_E2E=1 when they cannot run.
package systemdlab
