#!/usr/bin/env bash
# build-cluster.sh [BINDIR] - build and cache the real-cluster binaries used by the e2e harness:
#   kube-apiserver and upstream kube-proxy (k8s.io/kubernetes vK8S_VERSION, staging modules replaced by
#   their published v0.<minor>.<patch> releases) and etcd (go.etcd.io/etcd/server/v3 vETCD_VERSION).
# Everything comes from the Go module proxy; the sources are built in throw-away modules under BINDIR/.src
# so the project's own go.mod never sees k8s.io/kubernetes. A stamp file makes a second run instant.
#
# BINDIR defaults to ${KP_CLUSTER_BINDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-proxy-e2e/bin}.
# Env: K8S_VERSION (1.37.2), ETCD_VERSION (3.7.3), KP_BUILD_FORCE=1 rebuilds even when the stamp matches.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
BINDIR=${1:-${KP_CLUSTER_BINDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-proxy-e2e/bin}}
BINARIES=(kube-apiserver kube-proxy etcd)

now() { date +%s.%N; }
phase() { awk -v n="$1" -v a="$2" -v b="$(now)" 'BEGIN { printf "[build-cluster] %-28s %7.1fs\n", n, b - a }' >&2; }
log() { echo "[build-cluster] $*" >&2; }

export GOTOOLCHAIN=local
# shellcheck source=e2e/tools/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"
export GOFLAGS="-mod=mod -buildvcs=false"
command -v go >/dev/null || { log "go not found in PATH"; exit 1; }

mkdir -p "$BINDIR"
BINDIR=$(cd "$BINDIR" && pwd)
STAMP="k8s=v$K8S_VERSION etcd=v$ETCD_VERSION go=$(go env GOVERSION) recipe=1"

T_ALL=$(now)
skip_if_cached

MINOR=${K8S_VERSION#*.}; MINOR=${MINOR%%.*}
SRC=$BINDIR/.src
rm -rf "$SRC"
mkdir -p "$SRC/k8s" "$SRC/etcd"

# --- throw-away modules -------------------------------------------------------------------------------
T=$(now)
write_k8s_module "$SRC/k8s" kp-e2e-cluster/k8s k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-proxy
printf 'module kp-e2e-cluster/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$SRC/etcd/go.mod"
cat >"$SRC/etcd/tools.go" <<'GO'
//go:build tools

// Package tools pins the command this throw-away module builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
GO
(cd "$SRC/etcd" && go mod tidy)
phase "go.mod + download" "$T"

# --- builds (to temporary names, renamed into place only when all succeeded) ----------------------------
V=k8s.io/component-base/version
LDFLAGS="-s -w -X $V.gitVersion=v$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean"
T=$(now); (cd "$SRC/k8s" && go build -trimpath -ldflags "$LDFLAGS" -o "$BINDIR/.kube-apiserver.new" k8s.io/kubernetes/cmd/kube-apiserver)
phase "kube-apiserver" "$T"
T=$(now); (cd "$SRC/k8s" && go build -trimpath -ldflags "$LDFLAGS" -o "$BINDIR/.kube-proxy.new" k8s.io/kubernetes/cmd/kube-proxy)
phase "kube-proxy" "$T"
T=$(now); (cd "$SRC/etcd" && go build -trimpath -ldflags "-s -w" -o "$BINDIR/.etcd.new" go.etcd.io/etcd/server/v3)
phase "etcd" "$T"

for b in "${BINARIES[@]}"; do mv -f "$BINDIR/.$b.new" "$BINDIR/$b"; done
echo "$STAMP" >"$BINDIR/.stamp"
"$BINDIR/kube-apiserver" --version >&2 || true
"$BINDIR/etcd" --version 2>&1 | head -1 >&2 || true
phase "total (cold)" "$T_ALL"
log "binaries in $BINDIR"
