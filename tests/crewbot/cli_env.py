"""Running the real `crewbot` command in a subprocess: the environment without the operator's settings."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from core.settings import without_settings

COMMAND_WAIT_SECONDS = 120.0  # a loaded machine takes seconds just to import pydantic-ai
LOG_POLL_SECONDS = 0.1
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


def start_crewbot(args: list[str], env: dict[str, str], cwd: Path, stderr: IO[str]) -> subprocess.Popen[bytes]:
    """`python ARGS` (e.g. `-m crewbot run`) from `cwd`, its log into `stderr`; the caller stops it."""
    return subprocess.Popen(
        [sys.executable, *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
    )


def until_logged(bot: subprocess.Popen[bytes], log: Path, event: str) -> None:
    """Until the started command's log (the file its stderr goes to) holds `event`; fails if it exits first."""
    deadline = time.monotonic() + COMMAND_WAIT_SECONDS
    while event not in log.read_text():
        assert bot.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"the bot did not log {event} in time"
        time.sleep(LOG_POLL_SECONDS)
