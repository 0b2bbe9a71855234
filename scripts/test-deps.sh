#!/usr/bin/env bash
# What the tests need besides the virtual environment, the Docker engine and the subagent image:
# a static busybox (Debian's busybox-static) to build the tiny image the Docker runtime tests use.
# Installed with apt-get when missing (as root); otherwise says what to install.
set -euo pipefail

busybox=/bin/busybox

is_static() {
  # A dynamically linked ELF names its loader (ld-linux, ld-musl) near its start; a static one does not.
  [ -f "$1" ] && ! head -c 4096 "$1" | grep -aq -e ld-linux -e ld-musl
}

if is_static "$busybox"; then
  exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "test-deps: no static $busybox; as root: apt-get install busybox-static" \
    "(without it the Docker runtime tests skip, and fail under CI=true)" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 0
fi

echo "test-deps: installing Debian's busybox-static" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# apt's chatter (debconf, needrestart) only when something went wrong
if ! { apt-get update -qq && apt-get install -y -qq busybox-static; } >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "test-deps: apt-get install busybox-static failed" >&2
  exit 1
fi
rm -f "$log"
if ! is_static "$busybox"; then
  echo "test-deps: busybox-static is installed but $busybox is not a static binary" >&2
  exit 1
fi
echo "test-deps: ready" >&2
