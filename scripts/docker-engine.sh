#!/usr/bin/env bash
# Ensure a Docker engine answers on this machine. Installs Debian's docker.io and starts dockerd
# without a bridge or iptables (this machine allows only loopback traffic) when none runs.
# Also installs Debian's runsc (gVisor) where the archive has it and registers it as runtime `runsc`
# in daemon.json, so SUBAGENT_RUNTIME_CLASS=runsc works; gVisor is optional and never fails the script.
set -euo pipefail

daemon_json=${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
# dockerd records the pid of the engine this script started here; only that one is ever signalled.
our_pid_file=${CREWBOT_DOCKERD_PID_FILE:-/run/crewbot-dockerd.pid}
# ptrace: no KVM needed (and none usable here). host-uds=open: the subagent connects to its run channel,
# a host Unix socket bind-mounted into the container, which gVisor refuses by default. network=none:
# gVisor's netstack refuses Docker's `--network none` namespace here ("root network namespace"), and
# subagents need no network (everything goes over the run channel): loopback only, whatever the engine says.
runsc_args='["--platform=ptrace", "--host-uds=open", "--network=none"]'

say() { echo "docker-engine: $*" >&2; }

is_root() { [ "$(id -u)" = 0 ]; }

local_engine() {
  # A remote engine (DOCKER_HOST over tcp/ssh) has its own daemon.json: nothing to register here.
  case "${DOCKER_HOST:-unix://}" in unix://*) return 0 ;; *) return 1 ;; esac
}

# The running engine knows runsc exactly as daemon.json registers it (a stale entry counts as missing).
engine_has_runsc() {
  local engine
  engine=$(docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null) || return 1
  python3 - "$daemon_json" "$engine" <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as f:
        wanted = json.load(f)["runtimes"]["runsc"]
    sys.exit(0 if json.loads(sys.argv[2]) == wanted else 1)
except (OSError, ValueError, KeyError, TypeError):
    sys.exit(1)
PY
}

install_runsc() {
  command -v runsc >/dev/null 2>&1 && return 0
  is_root && command -v apt-get >/dev/null 2>&1 || return 1
  local candidate
  candidate=$(apt-cache policy runsc 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    candidate=$(apt-cache policy runsc 2>/dev/null | awk '/Candidate:/ {print $2}')
  fi
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    say "no runsc package in this system's archive; gVisor (SUBAGENT_RUNTIME_CLASS=runsc) is not available"
    return 1
  fi
  say "installing Debian's runsc (gVisor)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null 2>&1 || {
    say "apt-get install runsc failed; gVisor (SUBAGENT_RUNTIME_CLASS=runsc) is not available"
    return 1
  }
}

# Adds runtimes.runsc to daemon.json, keeping everything else in it. Prints "added" or "present";
# an operator's own runsc entry (other flags) is left alone, with a warning if it lacks host-uds.
register_runsc() {
  mkdir -p "$(dirname "$daemon_json")"
  python3 - "$daemon_json" "$(command -v runsc)" "$runsc_args" <<'PY'
import json, os, sys
path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with open(path) as f:
        text = f.read()
    config = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    config = {}
except ValueError as exc:
    print(f"docker-engine: {path} is not valid JSON ({exc}); runsc not registered", file=sys.stderr)
    sys.exit(1)
runtimes = config.setdefault("runtimes", {})
ours = {"path": runsc, "runtimeArgs": args}
if "runsc" in runtimes:
    if runtimes["runsc"] != ours and not any("host-uds" in a for a in runtimes["runsc"].get("runtimeArgs", [])):
        print(f"docker-engine: {path} has its own runsc entry without --host-uds=open: subagents under "
              "runsc cannot reach their run channel; add it to runtimeArgs", file=sys.stderr)
    print("present")
    sys.exit(0)
runtimes["runsc"] = ours
tmp = f"{path}.crewbot-tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("added")
PY
}

our_engine_pid() {
  # The pid this script started, if that process is still a dockerd.
  [ -f "$our_pid_file" ] || return 1
  local pid
  pid=$(cat "$our_pid_file")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}

# The running engine reloads daemon.json's runtimes on SIGHUP; a foreign engine is never signalled.
runsc_for_running_engine() {
  engine_has_runsc && return 0
  local pid
  if pid=$(our_engine_pid); then
    say "reloading the engine this script started (pid $pid) to pick up runtime runsc"
    kill -HUP "$pid"
    for _ in $(seq 1 10); do
      engine_has_runsc && return 0
      sleep 0.5
    done
    say "the engine (pid $pid) did not list runtime runsc after a reload; see its log"
    return 0
  fi
  say "runsc is registered in $daemon_json but the running engine was not started by this script:" \
    "reload it to use SUBAGENT_RUNTIME_CLASS=runsc (\`systemctl reload docker\`, or \`kill -HUP\` its dockerd)"
}

gvisor=0
if local_engine && is_root && install_runsc && register_runsc >/dev/null; then
  gvisor=1
fi

if docker info >/dev/null 2>&1; then
  [ "$gvisor" = 1 ] && runsc_for_running_engine
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if ! is_root; then
    say "no Docker engine and not root; install docker.io and start dockerd"
    exit 1
  fi
  say "installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq docker.io >/dev/null
fi

if ! is_root; then
  say "dockerd is installed but not running; start it as root"
  exit 1
fi

log_dir=${DOCKERD_LOG_DIR:-/var/log}
say "starting dockerd --bridge=none --iptables=false (log: $log_dir/crewbot-dockerd.log)"
# The engine outlives this script: it must not inherit a descriptor it was started with (e.g. a lock a
# caller holds with `flock FILE make test`, which would then stay held for the engine's life).
(
  for fd_path in /proc/self/fd/*; do
    fd=${fd_path##*/}
    if [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ]; then eval "exec $fd>&-"; fi
  done
  exec nohup dockerd --bridge=none --iptables=false >"$log_dir/crewbot-dockerd.log" 2>&1
) &
echo $! >"$our_pid_file"
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    if [ "$gvisor" = 1 ] && ! engine_has_runsc; then
      say "the engine does not list runtime runsc although $daemon_json registers it; see the log"
    fi
    if [ "$gvisor" = 1 ]; then say "ready (runtimes: runc, runsc)"; else say "ready"; fi
    exit 0
  fi
  sleep 1
done
say "dockerd did not answer within 60 s; see $log_dir/crewbot-dockerd.log"
exit 1
