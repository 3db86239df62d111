#!/usr/bin/env bash
# deps.sh [--conformance] - install the system packages the tests need on a fresh Debian 12 machine (run
# as root); --conformance adds what `make conformance` needs (a container runtime and CNI plugins).
# Idempotent and quiet: when every package is already installed it touches nothing, not even
# `apt-get update`, and returns in well under a second.
set -euo pipefail

PACKAGES=(
  # kernel data plane inside network namespaces
  iptables nftables conntrack ipset ipvsadm iproute2 kmod procps
  # certificates, HTTP probes, ad-hoc bridges
  openssl curl socat ca-certificates
  # IPVS tests in a qemu VM with a stock Debian kernel
  qemu-system-x86 busybox-static cpio
  # systemd tests: systemd-nspawn over a debootstrap rootfs
  systemd-container debootstrap
  # flock, used by e2e/tools/build-cluster.sh
  util-linux
)
# make conformance: each lab node runs its own containerd (runc; crun refuses this host's hybrid cgroup
# layout) with the reference CNI plugins; images are Debian trees from debootstrap.
if [[ ${1:-} == --conformance ]]; then
  PACKAGES+=(containerd runc containernetworking-plugins)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

if ((EUID != 0)); then
  echo "deps.sh: missing packages (${missing[*]}) and not root; run: sudo $0" >&2
  exit 1
fi

echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_quiet() { # run apt-get quietly, printing its output only when it fails
  local out
  if ! out=$(apt-get -qq -o=Dpkg::Use-Pty=0 "$@" 2>&1); then
    printf '%s\n' "$out" >&2
    echo "deps.sh: apt-get $* failed" >&2
    return 1
  fi
}
apt_quiet update
apt_quiet install -y --no-install-recommends "${missing[@]}"
echo "deps.sh: done" >&2
