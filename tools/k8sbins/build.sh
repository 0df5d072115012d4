#!/usr/bin/env bash
# Builds the local testbed's binaries, and a kubelet and crictl for running real pods, from the
# Go module proxy and caches them outside the repository, keyed by version (a binary
# added to the list lands in the same directory, so the testbed finds the others). The
# controllers of further wrapped kinds (JobSet, KubeRay) each get a directory of their own, keyed
# by their own version: see "add-on controllers" below.
# Idempotent: a binary that is already in the cache is not rebuilt. Prints one
# progress line per step.
#
#   tools/k8sbins/build.sh            # build whatever is missing
#   RESPAWN_CACHE_DIR=/x tools/k8sbins/build.sh
#   ADDON=jobset tools/k8sbins/build.sh   # of the add-on controllers, only this one (and of
#                                         # the rest, only the testbed's core)
#   tools/k8sbins/build.sh --demo     # only what `respawn local up` starts (`make demo`): not
#                                     # Kueue (`local up --kueue`), promtool (the monitoring
#                                     # tests) or crictl (`local up --real-node`); they are
#                                     # built when first needed
#
# Versions are pinned in versions.env next to this script.
set -euo pipefail
DEMO=0
case "${1:-}" in
  "") ;;
  --demo) DEMO=1 ;;
  *) printf 'usage: %s [--demo]\n' "$0" >&2; exit 2 ;;
esac
# crictl and promtool too: not with --demo, nor when asked for one add-on (ADDON).
EXTRAS=1
if [ "$DEMO" = 1 ] || [ -n "${ADDON:-}" ]; then EXTRAS=0; fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE_ROOT="${RESPAWN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/respawn}"
OUT="$CACHE_ROOT/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-to-$TRAINING_OPERATOR_VERSION"
mkdir -p "$OUT"

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf 'error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "'go' not found on PATH; install Go >= 1.24 (https://go.dev/dl) and retry"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"

need() { for b in "$@"; do [ -x "$OUT/$b" ] || return 0; done; return 1; }

if need kube-apiserver kube-controller-manager kube-scheduler kubelet etcd; then
  WORK="$CACHE_ROOT/gomod/k8s-$K8S_VERSION"
  mkdir -p "$WORK"
  log "preparing wrapper module for k8s.io/kubernetes $K8S_VERSION in $WORK"
  MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
  STAGING_VERSION="v0.${K8S_VERSION#v1.}"
  # The staging list is derived from the go.mod the proxy serves, never hard-coded:
  # every `k8s.io/x => ./staging/...` line becomes `k8s.io/x => k8s.io/x v0.Y.Z`.
  UPSTREAM_MOD="$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  [ -f "$UPSTREAM_MOD" ] || fail "could not download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy ($(go env GOPROXY)); check network/GOPROXY"
  {
    echo "module respawn.invalid/k8sbins"
    echo
    echo "go 1.24.0"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo ")"
    echo
    echo "replace ("
    sed -n 's|^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*|\1|p' "$UPSTREAM_MOD" | while read -r m; do
      echo "	$m => $m $STAGING_VERSION"
    done
    echo ")"
  } > "$WORK/go.mod"
  cat > "$WORK/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  log "resolving modules (go mod tidy)"
  (cd "$WORK" && go mod tidy) || fail "go mod tidy failed for k8s $K8S_VERSION; see output above"
  LD="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    if [ ! -x "$OUT/$cmd" ]; then
      log "building $cmd $K8S_VERSION (several minutes on a cold cache)"
      (cd "$WORK" && go build -ldflags "$LD" -o "$OUT/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") || fail "building $cmd failed; see output above"
      # The version is stamped by -ldflags; a binary that does not report it was built wrong.
      [ "$("$OUT/$cmd.tmp" --version 2>&1)" = "Kubernetes $K8S_VERSION" ] || fail "$cmd does not report version $K8S_VERSION after building; see '$OUT/$cmd.tmp --version'"
      mv "$OUT/$cmd.tmp" "$OUT/$cmd"
    fi
  done
  if [ ! -x "$OUT/etcd" ]; then
    log "building etcd $ETCD_VERSION"
    (cd "$WORK" && go build -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3) || fail "building etcd failed; see output above"
    mv "$OUT/etcd.tmp" "$OUT/etcd"
  fi
fi

if need kwok; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$OUT" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" || fail "building kwok failed; see output above"
fi

if need training-operator; then
  log "building kubeflow training-operator $TRAINING_OPERATOR_VERSION"
  TMPBIN="$(mktemp -d)"
  GOBIN="$TMPBIN" go install "github.com/kubeflow/training-operator/cmd/training-operator.v1@$TRAINING_OPERATOR_VERSION" || { rm -rf "$TMPBIN"; fail "building training-operator failed; see output above"; }
  mv "$TMPBIN/training-operator.v1" "$OUT/training-operator"; rm -rf "$TMPBIN"
fi

if [ "$EXTRAS" = 1 ] && need crictl; then
  log "building crictl $CRICTL_VERSION"
  GOBIN="$OUT" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" || fail "building crictl failed; see output above"
fi

# Its module has no replace directives, so `go install` builds it as published. About 5.5
# CPU-minutes on a cold module and build cache (measured: 285 s user + 47 s system, 163 modules).
if [ "$EXTRAS" = 1 ] && need promtool; then
  log "building promtool (prometheus $PROMETHEUS_VERSION)"
  GOBIN="$OUT" go install "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" || fail "building promtool failed; see output above"
fi

# ---------------------------------------------------------------- add-on controllers
# Controllers of further wrapped kinds, each in its own directory keyed by its own version
# ($CACHE_ROOT/bin/<binary>-<version>/<binary>), so that adding or bumping one never changes the
# Kubernetes directory above (which would rebuild Kubernetes). ADDON=<binary> builds just that one.
addon_dir() { echo "$CACHE_ROOT/bin/$1-$2"; }
# build_addon BINARY VERSION PACKAGE [GO_VERSION]: `go install PACKAGE@VERSION`; with GO_VERSION,
# through a wrapper module (go directive GO_VERSION) that requires the package's module at
# VERSION instead. The wrapper is for a module the proxy will not list: `go install m@v` also asks
# for the module's version list (to report deprecation) and fails when the proxy refuses it, as
# it does for sigs.k8s.io/jobset; a wrapper module needs only the pinned version.
build_addon() {
  local bin="$1" version="$2" pkg="$3" gover="${4:-}"
  local dir; dir="$(addon_dir "$bin" "$version")"
  [ -x "$dir/$bin" ] && return 0
  if [ -n "${ADDON:-}" ] && [ "$ADDON" != "$bin" ]; then return 0; fi
  mkdir -p "$dir"
  if [ -z "$gover" ]; then
    log "building $bin $version (go install $pkg@$version; a few minutes on a cold cache)"
    local tmpbin; tmpbin="$(mktemp -d)"
    GOBIN="$tmpbin" go install -ldflags "-s -w" "$pkg@$version" || { rm -rf "$tmpbin"; fail "building $bin failed; see output above"; }
    mv "$tmpbin/${pkg##*/}" "$dir/$bin"; rm -rf "$tmpbin"
    return 0
  fi
  local work="$CACHE_ROOT/gomod/$bin-$version"
  mkdir -p "$work"
  log "preparing wrapper module for $pkg $version in $work"
  printf 'module respawn.invalid/%s\n\ngo %s\n\nrequire %s %s\n' "$bin" "$gover" "$pkg" "$version" > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > "$work/tools.go"
  (cd "$work" && go mod tidy) || fail "go mod tidy failed for $pkg $version; see output above"
  log "building $bin $version (a few minutes on a cold cache)"
  (cd "$work" && go build -ldflags "-s -w" -o "$dir/$bin.tmp" "$pkg") || fail "building $bin failed; see output above"
  mv "$dir/$bin.tmp" "$dir/$bin"
}

# JobSet's main package is its module root (the module's go directive is 1.25.0).
build_addon jobset "$JOBSET_VERSION" sigs.k8s.io/jobset 1.25.0
build_addon ray-operator "$KUBERAY_VERSION" github.com/ray-project/kuberay/ray-operator
# Kueue (no replace directives in its go.mod: a plain go install).
[ "$DEMO" = 1 ] || build_addon kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
# ---------------------------------------------------------------- end of add-on controllers

log "all binaries ready in $OUT"
echo "$OUT"
