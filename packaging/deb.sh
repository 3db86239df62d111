#!/usr/bin/env bash
# deb.sh BINARY ARCH VERSION OUTDIR - build OUTDIR/kube-proxy_<debversion>_<ARCH>.deb with dpkg-deb and print
# its path.
#
#   /usr/bin/kube-proxy                              BINARY (a static linux/ARCH build)
#   /usr/lib/systemd/system/kube-proxy.service       systemd/kube-proxy.service with the binary's path
#                                                    rewritten to /usr/bin
#   /var/lib/kube-proxy/kube-proxy-config.yaml       conffile: kube-proxy-config.example.yaml
#   /usr/share/doc/kube-proxy/{README.md,INSTALL.md}
#
# VERSION is a git-describe string (v1.2.3, v1.2.3-4-gabcdef0, v1.2.3-rc.1, abcdef0-dirty); it becomes a
# Debian version that sorts the same way (1.2.3, 1.2.3+4.gabcdef0, 1.2.3~rc.1, 0.0.0~gitabcdef0+dirty).
# Env: SOURCE_DATE_EPOCH (file times; default: the last commit's), KP_DEB_CONFIG (the conffile's source,
# default kube-proxy-config.example.yaml; tests use it to build an upgrade whose packaged config changed),
# KP_DEB_COMPRESSION (dpkg-deb -Z: xz, the default, or gzip, faster for tests).
# `deb.sh --debian-version VERSION` only prints the Debian version for VERSION.
set -euo pipefail

# deb_version maps a git-describe string to a Debian version (no '-': this is a native package).
deb_version() {
	local v=${1#v} suffix=
	if [[ $v == *-dirty ]]; then v=${v%-dirty}; suffix=+dirty; fi
	if [[ $v =~ ^(.+)-([0-9]+)-g([0-9a-f]+)$ ]]; then # N commits after a tag: sorts after the tag
		v="${BASH_REMATCH[1]}+${BASH_REMATCH[2]}.g${BASH_REMATCH[3]}"
	fi
	[[ $v =~ ^[0-9]+\.[0-9] ]] || v="0.0.0~git$v" # no tag: git describe --always gave a commit hash
	v=${v//-/\~}                          # v1.2.3-rc.1: a pre-release sorts before the release
	printf '%s%s\n' "$v" "$suffix"
}

if [[ ${1:-} == --debian-version ]]; then
	deb_version "${2:?usage: $0 --debian-version VERSION}"
	exit 0
fi

usage="usage: $0 BINARY ARCH VERSION OUTDIR"
BIN=${1:?$usage} ARCH=${2:?$usage} VERSION=${3:?$usage} OUT=${4:?$usage}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
CONFIG=${KP_DEB_CONFIG:-$root/kube-proxy-config.example.yaml}
UNIT=$root/systemd/kube-proxy.service
: "${SOURCE_DATE_EPOCH:=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH

command -v dpkg-deb >/dev/null || { echo "deb.sh: dpkg-deb not found (apt-get install dpkg)" >&2; exit 1; }
case $ARCH in amd64 | arm64) ;; *) echo "deb.sh: unsupported ARCH $ARCH" >&2; exit 1 ;; esac

debver=$(deb_version "$VERSION")

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/kube-proxy
install -D -m 0755 "$BIN" "$pkg/usr/bin/kube-proxy"

# The unit is the hard-way unit with the binary where Debian packages keep theirs (policy: a package never
# installs into /usr/local). Its install comment is replaced, as it describes the manual install.
install -d "$pkg/usr/lib/systemd/system"
{
	echo "# kube-proxy, installed by the kube-proxy package. Change it with drop-ins: systemctl edit kube-proxy"
	sed -e '1,/^\[Unit\]/{/^#/d}' -e 's#/usr/local/bin/kube-proxy#/usr/bin/kube-proxy#g' "$UNIT"
} >"$pkg/usr/lib/systemd/system/kube-proxy.service"
chmod 0644 "$pkg/usr/lib/systemd/system/kube-proxy.service"
if grep -q /usr/local/bin "$pkg/usr/lib/systemd/system/kube-proxy.service" ||
	[[ $(grep -c '^Exec[A-Za-z]*=/usr/bin/kube-proxy' "$pkg/usr/lib/systemd/system/kube-proxy.service") -lt 2 ]]; then
	echo "deb.sh: rewriting the unit's binary path failed; does $UNIT still run /usr/local/bin/kube-proxy?" >&2
	exit 1
fi

install -D -m 0644 "$CONFIG" "$pkg/var/lib/kube-proxy/kube-proxy-config.yaml"
install -d "$pkg/usr/share/doc/kube-proxy"
"$here/readme-excerpt.sh" "$root/README.md" "$VERSION" "linux/$ARCH" >"$pkg/usr/share/doc/kube-proxy/README.md"
[[ -f $root/docs/INSTALL.md ]] && install -m 0644 "$root/docs/INSTALL.md" "$pkg/usr/share/doc/kube-proxy/INSTALL.md"

install -d "$pkg/DEBIAN"
install -m 0755 "$here/deb/postinst" "$here/deb/prerm" "$here/deb/postrm" "$pkg/DEBIAN/"
echo /var/lib/kube-proxy/kube-proxy-config.yaml >"$pkg/DEBIAN/conffiles"
cat >"$pkg/DEBIAN/control" <<EOF
Package: kube-proxy
Version: $debver
Architecture: $ARCH
Maintainer: ${KP_DEB_MAINTAINER:-kube-proxy maintainers <kube-proxy@localhost>}
Installed-Size: $(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
Depends: iptables
Recommends: conntrack, nftables
Suggests: ipset, ipvsadm
Section: net
Priority: optional
Description: Kubernetes network proxy, as a systemd service
 A drop-in reimplementation of Kubernetes' kube-proxy (v1.37) in one static
 binary: it reads upstream's KubeProxyConfiguration, watches Services and
 EndpointSlices, and programs iptables or IPVS so Service addresses reach
 their endpoints. The service is not started on install: add a kubeconfig
 to /var/lib/kube-proxy/, then run systemctl enable --now kube-proxy.
EOF
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"

find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$OUT"
deb="$OUT/kube-proxy_${debver}_${ARCH}.deb"
dpkg-deb --root-owner-group "-Z${KP_DEB_COMPRESSION:-xz}" --build "$pkg" "$deb" >/dev/null
echo "$deb"
