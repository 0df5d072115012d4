#!/usr/bin/env bash
# Shows that containerd runs the images tools/images/build.sh makes: starts a containerd
# of its own (root, state and socket under a temporary directory, so it clashes with no
# other containerd), imports every archive, runs a few commands in them, then stops that
# containerd and removes everything it made. Needs root; installs containerd and runc
# with apt-get when missing. Not part of `make test`.
#
#   tools/images/smoke.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf 'error: %s\n' "$*" >&2; exit 1; }
# shellcheck source=tools/lib/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/debian.sh"

[ "$(id -u)" = 0 ] || fail "the smoke test needs root (it runs containerd); rerun as root"
install_missing containerd runc

log "building the images (or finding them in the cache)"
LIST="$("$HERE/build.sh")" || fail "tools/images/build.sh failed; see the output above"
archive_of() { awk -v n="$1" '$1 == n { print $NF }' <<< "$LIST"; }
name_like() { awk -v p="$1" '$1 ~ p { print $1; exit }' <<< "$LIST"; }
RESPAWN="$(name_like '/respawn:')"
NATS="$(name_like '/respawn-nats:')"
PAUSE="$(name_like '/pause:')"
BUSYBOX="$(name_like '/busybox:')"
for n in "$RESPAWN" "$NATS" "$PAUSE" "$BUSYBOX"; do
  [ -n "$n" ] || fail "build.sh did not list the respawn, respawn-nats, pause and busybox images:"$'\n'"$LIST"
done

T="$(mktemp -d /tmp/respawn-smoke.XXXXXX)"
SOCK="$T/containerd.sock"
CTRD_PID=""
cleanup() {
  local rc=$?
  if [ -n "$CTRD_PID" ] && kill -0 "$CTRD_PID" 2>/dev/null; then
    # Tasks first (their shims outlive containerd otherwise), then containerd itself.
    for id in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    kill "$CTRD_PID" 2>/dev/null || true
    wait "$CTRD_PID" 2>/dev/null || true
  fi
  # Whatever is still mounted under the temporary directory (a snapshot of a killed task).
  awk -v t="$T" '$2 ~ "^" t { print $2 }' /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
  rm -rf "$T"
  exit "$rc"
}
trap cleanup EXIT

cat > "$T/config.toml" <<EOF
version = 2
root = "$T/root"
state = "$T/state"
# The CRI plugin is not needed here and would serve on a port; a kubelet uses its own containerd.
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$T/containerd-ttrpc.sock"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$T/opt"
EOF

log "starting containerd (state in $T)"
containerd --config "$T/config.toml" > "$T/containerd.log" 2>&1 &
CTRD_PID=$!
C() { ctr --address "$SOCK" -n k8s.io "$@"; }
deadline=$((SECONDS + 30))
until C version >/dev/null 2>&1; do
  kill -0 "$CTRD_PID" 2>/dev/null || fail "containerd exited during start-up: $(tail -n 3 "$T/containerd.log" | tr '\n' ' ')"
  [ "$SECONDS" -lt "$deadline" ] || fail "containerd did not answer on $SOCK within 30 s: $(tail -n 3 "$T/containerd.log" | tr '\n' ' ')"
  sleep 0.2
done

for n in "$RESPAWN" "$NATS" "$PAUSE" "$BUSYBOX"; do
  log "importing $n"
  C images import "$(archive_of "$n")" >&2 || fail "ctr images import of $n failed; see the output above"
  C images ls -q | grep -qx "$n" || fail "$n is not listed by containerd after its import"
done

check() { # check WHAT EXPECTED ACTUAL
  [ "$2" = "$3" ] || fail "$1: expected '$2', got '$3'"
  log "ok: $1"
}

out="$(C run --rm "$RESPAWN" smoke-respawn python -c "import services.watcher, shared; print('ok')")" \
  || fail "running python in $RESPAWN failed; see the output above"
check "$RESPAWN imports the services" ok "$out"
out="$(C run --rm "$RESPAWN" smoke-uid id -u)" || fail "running id -u in $RESPAWN failed"
check "$RESPAWN runs as uid 10001" 10001 "$out"

rc=0
C run --rm "$BUSYBOX" smoke-busybox sh -c "exit 3" || rc=$?
check "$BUSYBOX's exit code reaches containerd" 3 "$rc"

out="$(C run --rm "$NATS" smoke-nats nats-server --version)" || fail "running nats-server in $NATS failed"
check "$NATS holds the pinned nats-server" "nats-server: v${NATS##*:}" "$out"

# The pause container must keep running until asked to stop, and then exit 0.
C run --rm "$PAUSE" smoke-pause > "$T/pause.out" 2>&1 &
pause_pid=$!
deadline=$((SECONDS + 20))
until C tasks ls 2>/dev/null | awk '$1 == "smoke-pause" && $3 == "RUNNING"' | grep -q .; do
  kill -0 "$pause_pid" 2>/dev/null || fail "$PAUSE exited by itself: $(cat "$T/pause.out")"
  [ "$SECONDS" -lt "$deadline" ] || fail "$PAUSE did not reach RUNNING within 20 s"
  sleep 0.2
done
C tasks kill -s SIGTERM smoke-pause || fail "sending SIGTERM to $PAUSE failed"
rc=0
wait "$pause_pid" || rc=$?
check "$PAUSE exits 0 on SIGTERM" 0 "$rc"

log "all checks passed; stopping containerd"
