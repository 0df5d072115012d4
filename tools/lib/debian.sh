# shellcheck shell=bash
# Sourced by the tool scripts: installs the Debian packages of commands that are missing.
# The sourcing script defines log() and fail() (each prints in its own prefix).

# install_missing PACKAGE... : each PACKAGE provides the command of the same name; the missing
# ones are installed with apt-get in one go (we run as root), or the script fails naming them.
install_missing() {
  local missing=() package
  for package in "$@"; do
    command -v "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  log "installing ${missing[*]} from Debian's packages"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2 \
    || fail "installing ${missing[*]} with apt-get failed; see the output above"
}
