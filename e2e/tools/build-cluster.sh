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
export GOFLAGS="-mod=mod -buildvcs=false"
command -v go >/dev/null || { log "go not found in PATH"; exit 1; }

mkdir -p "$BINDIR"
BINDIR=$(cd "$BINDIR" && pwd)
STAMP="k8s=v$K8S_VERSION etcd=v$ETCD_VERSION go=$(go env GOVERSION) recipe=1"

cached() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x $BINDIR/$b ]] || return 1; done
  [[ "$(cat "$BINDIR/.stamp" 2>/dev/null)" == "$STAMP" ]]
}

T_ALL=$(now)
if [[ ${KP_BUILD_FORCE:-} != 1 ]] && cached; then
  log "binaries cached in $BINDIR ($STAMP)"
  phase "cache check" "$T_ALL"
  exit 0
fi

# One builder at a time per BINDIR: a second caller waits, then finds the stamp.
exec 9>"$BINDIR/.lock"
if ! flock -n 9; then
  log "another build holds $BINDIR/.lock; waiting"
  flock 9
fi
if [[ ${KP_BUILD_FORCE:-} != 1 ]] && cached; then
  log "binaries cached in $BINDIR (built by the other run)"
  exit 0
fi

MINOR=${K8S_VERSION#*.}; MINOR=${MINOR%%.*}
PATCH=${K8S_VERSION##*.}
STAGING_VERSION="v0.$MINOR.$PATCH"
SRC=$BINDIR/.src
rm -rf "$SRC"
mkdir -p "$SRC/k8s" "$SRC/etcd"

# --- throw-away modules -------------------------------------------------------------------------------
T=$(now)
KMOD=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[[ -f $KMOD ]] || { log "cannot locate go.mod of k8s.io/kubernetes@v$K8S_VERSION"; exit 1; }
# Every "k8s.io/X => ./staging/src/k8s.io/X" of k8s.io/kubernetes becomes "k8s.io/X => k8s.io/X v0.M.P".
# The two sample modules are not published at matching versions and nothing we build imports them.
mapfile -t STAGING < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$KMOD" |
  grep -vE '^k8s\.io/sample-(cli-plugin|controller)$')
((${#STAGING[@]} > 20)) || { log "found only ${#STAGING[@]} staging replaces in $KMOD"; exit 1; }
{
  printf 'module kp-e2e-cluster/k8s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$K8S_VERSION"
  for m in "${STAGING[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done
  printf ')\n'
} >"$SRC/k8s/go.mod"
cat >"$SRC/k8s/tools.go" <<'GO'
//go:build tools

// Package tools pins the commands this throw-away module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
printf 'module kp-e2e-cluster/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$SRC/etcd/go.mod"
cat >"$SRC/etcd/tools.go" <<'GO'
//go:build tools

// Package tools pins the command this throw-away module builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
GO
(cd "$SRC/k8s" && go mod tidy)
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
