"""Running the real `crewbot` command in a subprocess: the environment without the operator's settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core.settings import without_settings

COMMAND_WAIT_SECONDS = 120.0  # a loaded machine takes seconds just to import pydantic-ai
# Telegram's shape, and a value that must never appear in any output.
SECRET_TOKEN = "123456789:AAsecretTOKENvalueNEVERshown0123456"


def crewbot_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """This process's environment minus every crewbot setting, plus `settings`; no Docker engine."""
    env = without_settings(os.environ)
    env.update(
        DATA_DIR=str(data_dir),
        LLM_PROVIDER="offline",
        # No engine: these tests are about the chat side, and must not touch a real engine's containers.
        DOCKER_HOST=f"unix://{data_dir.parent}/no-docker-engine.sock",
        PYTHONUNBUFFERED="1",
        SUBAGENT_WARM_POOL="0",  # no engine to start a pool on (a test may still ask for one)
    )
    env.update(settings)
    return env


def run_crewbot(
    args: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m crewbot ARGS` from `cwd` (an empty folder: no stray .env is read)."""
    return subprocess.run(
        [sys.executable, "-m", "crewbot", *args],
        env=env,
        cwd=cwd,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_WAIT_SECONDS,
        check=False,
    )
