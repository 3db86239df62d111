#!/usr/bin/env bash
# build-conformance.sh [BINDIR] - build and cache what `make conformance` runs besides the cluster
# binaries of build-cluster.sh: kubelet, kube-controller-manager, kube-scheduler, kubectl, upstream's
# e2e.test and the agnhost test image's binary (k8s.io/kubernetes vK8S_VERSION, staging modules replaced
# by their published releases, as build-cluster.sh), the ginkgo CLI at the version k8s.io/kubernetes
# pins, and a CoreDNS (vCOREDNS_VERSION) whose main imports only the plugins cluster DNS needs.
# Everything comes from the Go module proxy, built in throw-away modules under BINDIR/.src; a stamp
# file makes a second run instant.
#
# BINDIR defaults to ${KP_CONFORMANCE_BINDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-proxy-e2e/conformance/bin}.
# Env: K8S_VERSION (1.37.2), COREDNS_VERSION (1.15.0), KP_BUILD_FORCE=1 rebuilds even when the stamp matches.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
COREDNS_VERSION=${COREDNS_VERSION:-1.15.0}
BINDIR=${1:-${KP_CONFORMANCE_BINDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-proxy-e2e/conformance/bin}}
K8S_COMMANDS=(kubelet kube-controller-manager kube-scheduler kubectl)
BINARIES=("${K8S_COMMANDS[@]}" e2e.test agnhost ginkgo coredns)
# The CoreDNS plugins the lab's Corefile uses (e2e/conformance writes it); nothing that reaches out.
COREDNS_PLUGINS=(bind cache errors health kubernetes loadbalance log ready)

now() { date +%s.%N; }
phase() { awk -v n="$1" -v a="$2" -v b="$(now)" 'BEGIN { printf "[build-conformance] %-24s %7.1fs\n", n, b - a }' >&2; }
log() { echo "[build-conformance] $*" >&2; }

export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -buildvcs=false"
command -v go >/dev/null || { log "go not found in PATH"; exit 1; }
# shellcheck source=e2e/tools/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

mkdir -p "$BINDIR"
BINDIR=$(cd "$BINDIR" && pwd)
STAMP="k8s=v$K8S_VERSION coredns=v$COREDNS_VERSION plugins=${COREDNS_PLUGINS[*]} go=$(go env GOVERSION) recipe=1"

T_ALL=$(now)
skip_if_cached

MINOR=${K8S_VERSION#*.}; MINOR=${MINOR%%.*}
SRC=$BINDIR/.src
rm -rf "$SRC"
mkdir -p "$SRC/coredns"

# --- throw-away modules -------------------------------------------------------------------------------
T=$(now)
pkgs=()
for c in "${K8S_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
write_k8s_module "$SRC/k8s" kp-e2e-conformance/k8s "${pkgs[@]}" \
  k8s.io/kubernetes/test/e2e k8s.io/kubernetes/test/images/agnhost github.com/onsi/ginkgo/v2/ginkgo

printf 'module kp-e2e-conformance/coredns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns v%s\n' \
  "$COREDNS_VERSION" >"$SRC/coredns/go.mod"
{
  printf '// Command coredns is CoreDNS with only the plugins the conformance lab uses.\npackage main\n\nimport (\n'
  printf '\t"github.com/coredns/coredns/core/dnsserver"\n\t"github.com/coredns/coredns/coremain"\n\n'
  for p in "${COREDNS_PLUGINS[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
  printf ')\n\nfunc init() {\n\t// The server types need the directive list; plugins not imported above are never registered.\n'
  printf '\t_ = dnsserver.Directives\n}\n\nfunc main() { coremain.Run() }\n'
} >"$SRC/coredns/main.go"
(cd "$SRC/coredns" && go mod tidy)
phase "go.mod + download" "$T"

# --- builds (to temporary names, renamed into place only when all succeeded) ----------------------------
V=k8s.io/component-base/version
LDFLAGS="-s -w -X $V.gitVersion=v$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean"
mkdir -p "$SRC/out"
T=$(now); (cd "$SRC/k8s" && go build -trimpath -ldflags "$LDFLAGS" -o "$SRC/out/" "${pkgs[@]}")
phase "${K8S_COMMANDS[*]}" "$T"
# agnhost runs in a Debian image with the same C library as this host, so cgo may stay on (and the
# build cache of the commands above serves it).
T=$(now); (cd "$SRC/k8s" && go build -trimpath -ldflags "-s -w" -o "$SRC/out/agnhost" k8s.io/kubernetes/test/images/agnhost)
phase "agnhost" "$T"
T=$(now); (cd "$SRC/k8s" && go build -trimpath -ldflags "-s -w" -o "$SRC/out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
phase "ginkgo" "$T"
T=$(now); (cd "$SRC/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$SRC/out/coredns" .)
phase "coredns" "$T"
# e2e.test: go test -c runs vet by default, which costs minutes and checks nothing of ours.
T=$(now); (cd "$SRC/k8s" && go test -c -vet=off -trimpath -ldflags "$LDFLAGS" -o "$SRC/out/e2e.test" k8s.io/kubernetes/test/e2e)
phase "e2e.test" "$T"

for b in "${BINARIES[@]}"; do mv -f "$SRC/out/$b" "$BINDIR/$b"; done
echo "$STAMP" >"$BINDIR/.stamp"
"$BINDIR/kubelet" --version >&2 || true
phase "total (cold)" "$T_ALL"
log "binaries in $BINDIR"
