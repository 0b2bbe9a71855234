"""The subagent image, built for real and run the way the task manager runs it (sandboxed, no network)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from container.__main__ import EXIT_BAD_TASK, EXIT_COMPLETED
from container.protocol import CHANNEL_DIR, CHANNEL_SOCKET_FILE, TASK_PATH, WORKSPACE_DIR, RunResult, TaskSpec
from runner.runtimes.image import DEFAULT_IMAGE, LABEL_CONTENT_HASH, build_image, image_exists, image_status
from tests.container.scripted_llm import Refusal, ScriptedLLM, TextReply, ToolCallReply

pytestmark = pytest.mark.docker

AGENT_UID = 1000
CONTAINER_WAIT_SECONDS = 120
SHARED_DIR_MODE = 0o777  # the container's uid 1000 writes into folders the test (maybe root) made
CHANNEL_DIR_MODE = 0o755  # as the host makes it: the container reaches the socket, never writes beside it
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


@pytest.fixture(scope="session")
def agent_image(docker_engine: None) -> str:
    """The image, built once per session (a no-op when it is current)."""
    build_image(DEFAULT_IMAGE, log=lambda line: None)
    return DEFAULT_IMAGE


@pytest.fixture
def docker_client(docker_engine: None) -> Iterator[Any]:
    client = docker.from_env(timeout=CONTAINER_WAIT_SECONDS)
    yield client
    client.close()


@dataclass(frozen=True, slots=True)
class Mounts:
    """The two mounts a run's container gets: the chat's workspace and, read-only, its channel folder."""

    channel_dir: Path
    workspace_dir: Path

    @property
    def socket(self) -> Path:
        return self.channel_dir / CHANNEL_SOCKET_FILE

    def volumes(self) -> dict[str, dict[str, str]]:
        return {
            str(self.channel_dir): {"bind": CHANNEL_DIR, "mode": "ro"},
            str(self.workspace_dir): {"bind": WORKSPACE_DIR, "mode": "rw"},
        }


@pytest.fixture
def mounts(tmp_path: Path) -> Mounts:
    mounts = Mounts(channel_dir=tmp_path / "channel", workspace_dir=tmp_path / "workspace")
    mounts.channel_dir.mkdir()
    os.chmod(mounts.channel_dir, CHANNEL_DIR_MODE)
    mounts.workspace_dir.mkdir()
    os.chmod(mounts.workspace_dir, SHARED_DIR_MODE)
    return mounts


def run_sandboxed(client: Any, image: str, mounts: Mounts, **overrides: Any) -> tuple[int, str]:
    """Run a container as the task manager does; return its exit code and logs. Blocks: use a thread."""
    options: dict[str, Any] = {
        "detach": True,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": "rw,size=64m"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "user": f"{AGENT_UID}:{AGENT_UID}",
        "mem_limit": "512m",
        "pids_limit": 256,
        "volumes": mounts.volumes(),
        "labels": {"crewbot.test": "test_image"},
    }
    container = client.containers.run(image, **(options | overrides))
    try:
        exit_code = int(container.wait(timeout=CONTAINER_WAIT_SECONDS)["StatusCode"])
        return exit_code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_image_is_built_and_current(agent_image: str, docker_client: Any) -> None:
    assert image_exists(agent_image)
    assert image_status(agent_image) == "current"
    config = docker_client.images.get(agent_image).attrs["Config"]
    assert config["User"] == "agent"
    assert config["WorkingDir"] == WORKSPACE_DIR
    assert config["Entrypoint"] == ["/opt/venv/bin/python", "-P", "-m", "container"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]
    assert len(config["Labels"][LABEL_CONTENT_HASH]) == 64


async def test_container_completes_a_task_through_the_socket(
    agent_image: str, docker_client: Any, mounts: Mounts
) -> None:
    task = TaskSpec(run_id="run-image-1", task="Write hello to out.txt", label="hello", model="scripted-model")
    script = [
        ToolCallReply("bash", {"command": "echo hello > out.txt && cat out.txt"}),
        ToolCallReply("send_message", {"text": "wrote the file"}),
        TextReply("Done: out.txt says hello."),
    ]
    host = ScriptedLLM(mounts.socket, script, task=task)
    async with host:
        exit_code, logs = await asyncio.to_thread(run_sandboxed, docker_client, agent_image, mounts)

    assert exit_code == EXIT_COMPLETED, logs
    assert host.results == [
        RunResult(status="completed", result="Done: out.txt says hello.", input_tokens=33, output_tokens=21)
    ]
    assert len(host.requests) == 3
    assert [m["content"] for m in host.requests[1]["messages"] if m["role"] == "tool"] == ["hello\n[exit code: 0]"]
    out_file = mounts.workspace_dir / "out.txt"
    assert (out_file.read_text(), out_file.stat().st_uid) == ("hello\n", AGENT_UID)
    assert [message.text for message in host.messages] == ["wrote the file"]
    assert len(host.saved_history()) == 6
    assert list(mounts.channel_dir.iterdir()) == []  # the host's socket is gone; the container left nothing
    assert "crewbot-agent: run run-image-1: completed" in logs


async def test_container_with_a_refused_task_exits_bad_task(
    agent_image: str, docker_client: Any, mounts: Mounts
) -> None:
    task = TaskSpec(run_id="run-image-2", task="never run", label="refused")
    host = ScriptedLLM(
        mounts.socket, [TextReply("unreached")], task=task, refusals={TASK_PATH: Refusal(403, "go away")}
    )
    async with host:
        exit_code, logs = await asyncio.to_thread(run_sandboxed, docker_client, agent_image, mounts)

    assert exit_code == EXIT_BAD_TASK, logs
    assert (host.requests, host.results) == ([], [])
    assert "no usable task from the run channel: ChannelRefused: go away" in logs


def test_container_sandbox(agent_image: str, docker_client: Any, mounts: Mounts) -> None:
    probe = (
        "echo uid=$(id -u); echo net=$(ls /sys/class/net | tr '\\n' ,); "
        "touch /probe 2>/dev/null && echo root=writable || echo root=read-only; "
        "touch /tmp/probe && echo tmp=writable; "
        "touch /workspace/probe && echo workspace=writable; "
        "touch /crewbot/channel/probe 2>/dev/null && echo channel=writable || echo channel=read-only; "
        "echo python=$(python3 -c 'import sys; print(sys.version_info[:2] == (3, 11))'); "
        "echo env-names=$(env | cut -d= -f1 | tr '\\n' ,)"
    )
    exit_code, logs = run_sandboxed(docker_client, agent_image, mounts, entrypoint=["/bin/bash", "-c"], command=[probe])

    assert exit_code == 0, logs
    facts = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    assert facts["uid"] == str(AGENT_UID)
    assert facts["net"] == "lo,"
    assert facts["root"] == "read-only"
    assert (facts["tmp"], facts["workspace"], facts["python"]) == ("writable", "writable", "True")
    assert facts["channel"] == "read-only"
    env_names = [name for name in facts["env-names"].split(",") if name]
    assert "PATH" in env_names
    assert not [name for name in env_names if any(word in name.upper() for word in SECRET_WORDS)]
