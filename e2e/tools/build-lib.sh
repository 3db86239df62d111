# build-lib.sh - sourced by the build scripts (build-cluster.sh, build-conformance.sh).
#
#   skip_if_cached
# exits 0 when BINDIR holds every one of BINARIES built with STAMP (in BINDIR/.stamp); otherwise takes
# BINDIR/.lock, so one builder runs at a time (a second caller waits, then finds the stamp), and returns.
# Needs BINDIR, BINARIES, STAMP and a log function; KP_BUILD_FORCE=1 always builds.
#
#   write_k8s_module DIR MODULE PACKAGE...
# writes DIR/go.mod (module MODULE) and DIR/tools.go importing each PACKAGE, then runs go mod tidy.
# Needs K8S_VERSION and the go command; the caller sets GOFLAGS and GOTOOLCHAIN.

skip_if_cached() {
  if [[ ${KP_BUILD_FORCE:-} != 1 ]] && stamped; then
    log "binaries cached in $BINDIR ($STAMP)"
    exit 0
  fi
  exec 9>"$BINDIR/.lock"
  if ! flock -n 9; then
    log "another build holds $BINDIR/.lock; waiting"
    flock 9
  fi
  if [[ ${KP_BUILD_FORCE:-} != 1 ]] && stamped; then
    log "binaries cached in $BINDIR (built by the other run)"
    exit 0
  fi
}

stamped() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x $BINDIR/$b ]] || return 1; done
  [[ "$(cat "$BINDIR/.stamp" 2>/dev/null)" == "$STAMP" ]]
}

write_k8s_module() {
  local dir=$1 module=$2 kmod minor patch m p
  shift 2
  kmod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [[ -f $kmod ]] || { echo "cannot locate go.mod of k8s.io/kubernetes@v$K8S_VERSION" >&2; return 1; }
  minor=${K8S_VERSION#*.}; minor=${minor%%.*}
  patch=${K8S_VERSION##*.}
  # Every "k8s.io/X => ./staging/src/k8s.io/X" of k8s.io/kubernetes becomes "k8s.io/X => k8s.io/X v0.M.P".
  # The two sample modules are not published at matching versions and nothing we build imports them.
  local staging
  mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$kmod" |
    grep -vE '^k8s\.io/sample-(cli-plugin|controller)$')
  ((${#staging[@]} > 20)) || { echo "found only ${#staging[@]} staging replaces in $kmod" >&2; return 1; }
  mkdir -p "$dir"
  {
    printf 'module %s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$module" "$K8S_VERSION"
    for m in "${staging[@]}"; do printf '\t%s => %s v0.%s.%s\n' "$m" "$m" "$minor" "$patch"; done
    printf ')\n'
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\n// Package tools pins the commands this throw-away module builds.\npackage tools\n\nimport (\n'
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$dir/tools.go"
  (cd "$dir" && go mod tidy)
}
