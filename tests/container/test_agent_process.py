"""The container agent as a process (`python -m container`): SIGTERM mid-command ends it at once, with a
failed result reported and no command left running."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from container.__main__ import EXIT_FAILED
from container.paths import CHANNEL_SOCKET_ENV, WORKSPACE_DIR_ENV, ContainerPaths
from tests.container.agent_helpers import scripted_host
from tests.container.scripted_llm import ToolCallReply

REPO_ROOT = Path(__file__).resolve().parents[2]
PROCESS_START_SECONDS = 120
STOP_SECONDS = 30


async def test_sigterm_stops_the_process_and_still_reports(paths: ContainerPaths) -> None:
    """`python -m container` as a process: SIGTERM mid-command ends it at once with a failed result."""
    environ = {
        **os.environ,
        CHANNEL_SOCKET_ENV: str(paths.channel_socket),
        WORKSPACE_DIR_ENV: str(paths.workspace_dir),
    }
    # The pid file appears whole (rename), so the signal never lands between its creation and its write.
    script = [ToolCallReply("bash", {"command": "echo $$ > shell.pid.tmp && mv shell.pid.tmp shell.pid; sleep 60"})]
    async with scripted_host(paths, script) as host:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "container", cwd=REPO_ROOT, env=environ, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(PROCESS_START_SECONDS):  # generous: a loaded machine starts Python slowly
                while b"tool bash(" not in await process.stdout.readline():
                    pass
                await asyncio.to_thread(wait_for_file, paths.workspace_dir / "shell.pid")
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(STOP_SECONDS):  # the command sleeps 60 s: only the signal ends it sooner
                exit_code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    assert exit_code == EXIT_FAILED
    assert [(r.status, r.error) for r in host.results] == [("failed", "stopped by a signal")]
    assert host.sessions == []
    assert not is_running(int(read_text(paths.workspace_dir / "shell.pid"))), "the command outlived the agent"


def wait_for_file(path: Path, timeout_seconds: float = PROCESS_START_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def read_text(path: Path) -> str:
    return path.read_text()


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
