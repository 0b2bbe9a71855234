"""The subagent image, built for real and run the way the task manager runs it (sandboxed, no network)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from container.protocol import IPC_DIR, RUN_DIR, WORKSPACE_DIR, RunResult, TaskSpec, write_json_atomic
from container.session import load_history
from runner.image import DEFAULT_IMAGE, LABEL_CONTENT_HASH, build_image, image_exists, image_status
from tests.container.scripted_llm import ScriptedLLM, TextReply, ToolCallReply

pytestmark = pytest.mark.docker

AGENT_UID = 1000
CONTAINER_WAIT_SECONDS = 120
SHARED_DIR_MODE = 0o777  # the container's uid 1000 writes into folders the test (maybe root) made
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
    run_dir: Path
    ipc_dir: Path
    workspace_dir: Path

    def volumes(self) -> dict[str, dict[str, str]]:
        return {
            str(self.run_dir): {"bind": RUN_DIR, "mode": "rw"},
            str(self.ipc_dir): {"bind": IPC_DIR, "mode": "rw"},
            str(self.workspace_dir): {"bind": WORKSPACE_DIR, "mode": "rw"},
        }


@pytest.fixture
def mounts(tmp_path: Path) -> Mounts:
    mounts = Mounts(run_dir=tmp_path / "run", ipc_dir=tmp_path / "ipc", workspace_dir=tmp_path / "workspace")
    for folder in (mounts.run_dir, mounts.ipc_dir, mounts.workspace_dir):
        folder.mkdir()
        os.chmod(folder, SHARED_DIR_MODE)
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
    assert image_status(agent_image, log=lambda line: None) == "current"
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
    write_json_atomic(mounts.run_dir / "task.json", task)
    script = [
        ToolCallReply("bash", {"command": "echo hello > out.txt && cat out.txt"}),
        ToolCallReply("send_message", {"text": "wrote the file"}),
        TextReply("Done: out.txt says hello."),
    ]
    llm = ScriptedLLM(mounts.run_dir / "llm.sock", script)
    async with llm:
        exit_code, logs = await asyncio.to_thread(run_sandboxed, docker_client, agent_image, mounts)

    assert exit_code == 0, logs
    result = RunResult.model_validate_json((mounts.run_dir / "result.json").read_bytes())
    assert (result.run_id, result.status, result.result) == ("run-image-1", "completed", "Done: out.txt says hello.")
    assert len(llm.requests) == 3
    assert [m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool"] == ["hello\n[exit code: 0]"]
    out_file = mounts.workspace_dir / "out.txt"
    assert (out_file.read_text(), out_file.stat().st_uid) == ("hello\n", AGENT_UID)
    (message_file,) = (mounts.ipc_dir / "messages").iterdir()
    assert json.loads(message_file.read_text())["text"] == "wrote the file"
    assert len(load_history(mounts.run_dir / "session_out.json")) == 6
    assert "crewbot-agent: run run-image-1: completed" in logs


def test_container_sandbox(agent_image: str, docker_client: Any, mounts: Mounts) -> None:
    probe = (
        "echo uid=$(id -u); echo net=$(ls /sys/class/net | tr '\\n' ,); "
        "touch /probe 2>/dev/null && echo root=writable || echo root=read-only; "
        "touch /tmp/probe && echo tmp=writable; "
        "touch /workspace/probe && echo workspace=writable; "
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
    env_names = [name for name in facts["env-names"].split(",") if name]
    assert "PATH" in env_names
    assert not [name for name in env_names if any(word in name.upper() for word in SECRET_WORDS)]
