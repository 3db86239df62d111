#!/usr/bin/env bash
# tarball.sh BINARY ARCH VERSION OUTDIR - build OUTDIR/kube-proxy-VERSION-linux-ARCH.tar.gz and print its path.
# It unpacks into kube-proxy-VERSION-linux-ARCH/ with the paths of a source checkout, so the install
# commands of README.md and docs/INSTALL.md work from either:
#   kube-proxy  systemd/kube-proxy.service  kube-proxy-config.example.yaml  README.md  INSTALL.md
# The archive is reproducible: sorted names, root-owned, every time SOURCE_DATE_EPOCH (default: the last
# commit's), gzip without a timestamp.
set -euo pipefail
usage="usage: $0 BINARY ARCH VERSION OUTDIR"
BIN=${1:?$usage} ARCH=${2:?$usage} VERSION=${3:?$usage} OUT=${4:?$usage}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
: "${SOURCE_DATE_EPOCH:=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}"

name=kube-proxy-$VERSION-linux-$ARCH
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
d=$stage/$name
install -D -m 0755 "$BIN" "$d/kube-proxy"
install -D -m 0644 "$root/systemd/kube-proxy.service" "$d/systemd/kube-proxy.service"
install -m 0644 "$root/kube-proxy-config.example.yaml" "$d/"
"$here/readme-excerpt.sh" "$root/README.md" "$VERSION" "linux/$ARCH" >"$d/README.md"
install -m 0644 "$root/docs/INSTALL.md" "$d/INSTALL.md"
chmod 0644 "$d/README.md"

mkdir -p "$OUT"
out="$(cd "$OUT" && pwd)/$name.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
	--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
	-C "$stage" -cf - "$name" | gzip -9 -n >"$out"
echo "$out"
