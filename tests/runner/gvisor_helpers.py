"""What the gVisor tests share: whether the engine has runtime `runsc`, and what to do when it has not.

`make test` runs scripts/docker-engine.sh, which installs Debian's runsc and registers it; so under CI=true
a missing runsc is a failure unless this system's archive has no runsc package at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import docker
import pytest

RUNSC = "runsc"
# The pids limit these tests give a gVisor container: the sandbox's own threads count against it (about 70,
# plus some per process), so the runc tests' 64 would leave no room for a shell's pipe.
GVISOR_PIDS = 256
APT_TIMEOUT_SECONDS = 30


def engine_runtimes() -> dict[str, object]:
    client = docker.from_env()
    try:
        return dict(client.info().get("Runtimes") or {})
    finally:
        client.close()


def _archive_has_runsc() -> bool:
    """apt knows a runsc package (so scripts/docker-engine.sh would have installed it)."""
    if shutil.which("runsc"):
        return True
    if not shutil.which("apt-cache"):
        return False
    policy = subprocess.run(
        ["apt-cache", "policy", RUNSC], capture_output=True, text=True, timeout=APT_TIMEOUT_SECONDS, check=False
    ).stdout
    return "Candidate:" in policy and "Candidate: (none)" not in policy


def require_runsc() -> None:
    """Skip (fail under CI=true, where the script installs it) unless the engine lists runtime runsc."""
    if RUNSC in engine_runtimes():
        return
    reason = (
        "the Docker engine has no runtime runsc (gVisor): `make engine` installs Debian's runsc and registers it "
        "in /etc/docker/daemon.json; an engine it did not start must be reloaded (SIGHUP) to see it"
    )
    if os.environ.get("CI", "").lower() == "true" and _archive_has_runsc():
        pytest.fail(f"{reason} (CI=true: runsc should be there)")
    pytest.skip(reason)
