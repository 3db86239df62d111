#!/usr/bin/env bash
# release.sh [OUTDIR] - everything a release publishes, for linux/amd64 and linux/arm64, into OUTDIR
# (default dist/, emptied first):
#   kube-proxy-linux-ARCH                        the bare static binary (what a user wgets)
#   kube-proxy-VERSION-linux-ARCH.tar.gz         binary, unit, example config, README excerpt, INSTALL.md
#   kube-proxy_DEBVERSION_ARCH.deb               the Debian package (packaging/deb.sh)
#   kube-proxy.service                           the unit (for those who wget the bare binary)
#   kube-proxy-daemonset.yaml                    packaging/kubernetes/kube-proxy.yaml with the image set
#   SHA256SUMS                                   of all of the above (sha256sum --check --ignore-missing)
# Env (make release passes the first three): VERSION (default: git describe --tags --always --dirty),
# COMMIT, LDFLAGS (default: -s -w with main.version and main.commit), ARCHES (default "amd64 arm64"),
# KP_IMAGE (the DaemonSet's image, default kube-proxy:VERSION), SOURCE_DATE_EPOCH (default: last commit's).
# Same commit and Go version give byte-identical files.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
OUT=${1:-$root/dist}
cd "$root"

: "${VERSION:=$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)}"
: "${COMMIT:=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
: "${LDFLAGS:=-s -w -X main.version=$VERSION -X main.commit=$COMMIT}"
: "${ARCHES:=amd64 arm64}"
: "${KP_IMAGE:=kube-proxy:$VERSION}"
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH

rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for arch in $ARCHES; do
	bin=$OUT/kube-proxy-linux-$arch
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o "$bin" .
	# A release binary must be static: it runs on any distribution and inside a scratch image.
	go version -m "$bin" | grep -q 'CGO_ENABLED=0' || { echo "release.sh: $bin is not a CGO_ENABLED=0 build" >&2; exit 1; }
	"$here/tarball.sh" "$bin" "$arch" "$VERSION" "$OUT" >/dev/null
	"$here/deb.sh" "$bin" "$arch" "$VERSION" "$OUT" >/dev/null
done
install -m 0644 systemd/kube-proxy.service "$OUT/kube-proxy.service"
# The image line is the manifest's only "image:"; fail rather than publish a manifest with the placeholder.
sed "s#^\(\s*image:\s*\).*#\1$KP_IMAGE#" "$here/kubernetes/kube-proxy.yaml" >"$OUT/kube-proxy-daemonset.yaml"
[[ $(grep -c "image: $KP_IMAGE\$" "$OUT/kube-proxy-daemonset.yaml") == 1 ]] ||
	{ echo "release.sh: setting the DaemonSet's image failed" >&2; exit 1; }
touch -d "@$SOURCE_DATE_EPOCH" "$OUT"/*
(cd "$OUT" && export LC_ALL=C && files=(*) && sha256sum -- "${files[@]}" >SHA256SUMS) # glob before the file exists
echo "release $VERSION in $OUT:"
(cd "$OUT" && ls -l)
