#!/usr/bin/env bash
# Ensure a Docker engine answers on this machine. Installs Debian's docker.io and starts dockerd
# without a bridge or iptables (this machine allows only loopback traffic) when none runs.
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "docker-engine: no Docker engine and not root; install docker.io and start dockerd" >&2
    exit 1
  fi
  echo "docker-engine: installing Debian's docker.io" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq docker.io >/dev/null
fi

if [ "$(id -u)" != 0 ]; then
  echo "docker-engine: dockerd is installed but not running; start it as root" >&2
  exit 1
fi

log_dir=${DOCKERD_LOG_DIR:-/var/log}
echo "docker-engine: starting dockerd --bridge=none --iptables=false (log: $log_dir/crewbot-dockerd.log)" >&2
nohup dockerd --bridge=none --iptables=false >"$log_dir/crewbot-dockerd.log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker-engine: ready" >&2
    exit 0
  fi
  sleep 1
done
echo "docker-engine: dockerd did not answer within 60 s; see $log_dir/crewbot-dockerd.log" >&2
exit 1
