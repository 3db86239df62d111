#!/usr/bin/env bash
# rootfs.sh SUITE DEST - build (once) a minimal Debian root file system that boots systemd as PID 1 under
# systemd-nspawn, for the real-systemd tests. SUITE is bookworm (systemd 252) or trixie (systemd 257).
#
# The tree is built in DEST.tmp and renamed to DEST when complete, so DEST either does not exist or is a
# finished rootfs (marked by DEST/.kp-lab-ready). Concurrent callers serialise on DEST.lock. The tests boot
# it with --volatile=overlay, so it stays pristine and is reused by every run on this machine.
#
# Env: KP_LAB_MIRROR (default: the host's Debian mirror, else deb.debian.org).
set -euo pipefail
SUITE=${1:?usage: $0 SUITE DEST}
DEST=${2:?usage: $0 SUITE DEST}
READY_MARK=.kp-lab-ready
# Everything the tests use inside: systemd + dbus (systemctl, journalctl, systemd-analyze), iptables and
# iproute2 (the daemon and the checks), procps, apt/dpkg (minbase has them) for the .deb, and what the .deb
# depends on or recommends (iptables, conntrack, nftables), since the machines have no network to fetch it.
PKGS=systemd,systemd-sysv,dbus,procps,iptables,iproute2,kmod,conntrack,nftables
# The mark holds the package list: a tree built for another list is rebuilt.
ready() { [[ -e $DEST/$READY_MARK && $(<"$DEST/$READY_MARK") == "$PKGS" ]]; }

ready && exit 0
mkdir -p "$(dirname "$DEST")"
exec 9>"$DEST.lock"
flock 9
ready && exit 0 # built by whoever held the lock

for cmd in debootstrap systemd-nspawn; do
  command -v "$cmd" >/dev/null || {
    echo "rootfs.sh: $cmd missing (install systemd-container and debootstrap: .ci/deps.sh)" >&2
    exit 1
  }
done

mirror=${KP_LAB_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}
start=$(date +%s)
rm -rf "$DEST.tmp"
if ! debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$DEST.tmp" "$mirror" >"$DEST.log" 2>&1; then
  echo "rootfs.sh: debootstrap $SUITE failed; last lines of $DEST.log:" >&2
  tail -n 20 "$DEST.log" >&2
  rm -rf "$DEST.tmp"
  exit 1
fi
echo lab >"$DEST.tmp/etc/hostname"
# Nothing but the test should run: no gettys, no timers that would wake up mid-test.
for u in console-getty.service getty@tty1.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
  e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer; do
  ln -sf /dev/null "$DEST.tmp/etc/systemd/system/$u"
done
# The tests install a local .deb with apt; without package lists apt still resolves it against what is
# installed, which is all it needs (the package depends on iptables only).
rm -rf "$DEST.tmp/var/cache/apt/archives/"*.deb
echo "$PKGS" >"$DEST.tmp/$READY_MARK"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "rootfs.sh: built $SUITE rootfs in $DEST in $(($(date +%s) - start)) s" >&2
