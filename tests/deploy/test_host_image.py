"""The host image for real: `scripts/host_image.py` (what `make host-image` runs) builds deploy/Dockerfile.host from
a copy of these sources, on the subagent image's base; it runs as the Dockerfile's header says (`--env-file`,
DATA_DIR the same path inside and outside, the engine's socket mounted; `--network host` reaches the fake Bot
API and the fake LLM on 127.0.0.1), passes its own health check, `crewbot doctor` inside it is all ok, a message
to the fake chat makes the fake LLM spawn a subagent whose computed result reaches the chat, and SIGTERM stops
it cleanly (exit 0)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import pytest

from runner.runtimes.image import LABEL_BASE_IMAGE
from runner.runtimes.runtime import LABEL_CHAT_ID
from tests.fakes.llm_replies import JsonDict
from tests.fakes.llm_server import FakeLLM, openai_text, openai_tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.runner.docker_helpers import TEST_LABEL
from tests.test_wheel import BUILD_FILES, PACKAGES

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1_500)]

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
HOST_FILES = ("deploy/Dockerfile.host", ".dockerignore")  # besides what the wheel is built from
BUILD_WAIT_SECONDS = 1_200.0  # every wheel, then ~300 MB installed in a build on a busy 2-core machine
HEALTHY_WAIT_SECONDS = 120.0  # a loaded machine takes seconds to import pydantic-ai
RESULT_WAIT_SECONDS = 240.0  # the main agent's turn, a subagent container's start and two model steps
COMMAND_WAIT_SECONDS = 120.0
STOP_GRACE_SECONDS = 30
HEALTH_INTERVAL = "2s"  # the image's 30 s stays the production interval; the test need not wait for it
POLL_SECONDS = 0.2
DEFAULT_SOCKET = "/var/run/docker.sock"
KEY = "sk-host-image-test-key"
TASK = "echo computed-$((6 * 7))"  # only a shell that ran it prints computed-42


def run(args: list[str], timeout_seconds: float = COMMAND_WAIT_SECONDS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_seconds, check=False
    )


def engine_socket() -> str:
    """The engine's socket on this machine: what the bot's container gets mounted as /var/run/docker.sock."""
    host = os.environ.get("DOCKER_HOST", f"unix://{DEFAULT_SOCKET}")
    if not host.startswith("unix://"):
        pytest.skip(f"DOCKER_HOST={host}: the host image drives a local engine through its socket")
    return host.removeprefix("unix://")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def host_image(subagent_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """crewbot-host-test:<random>, built by scripts/host_image.py from a copy of the sources (its wheels, build/
    and egg-info stay out of the checkout others work in); removed after."""
    source = tmp_path_factory.mktemp("host-image") / "source"
    for name in (*BUILD_FILES, *HOST_FILES):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    tag = f"crewbot-host-test:{secrets.token_hex(4)}"
    client = docker.from_env()
    try:
        built = run(
            [sys.executable, str(ROOT / "scripts" / "host_image.py"), "--root", str(source), "--tag", tag],
            BUILD_WAIT_SECONDS,
        )
        assert built.returncode == 0, f"host image build failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
        print(built.stdout.splitlines()[-1])  # its time and size, for `pytest -s`
        labels = client.images.get(tag).labels
        # The same base as the subagent image, chosen the same way (runner/runtimes/image_base.py).
        assert labels["crewbot.host.base"] == client.images.get(subagent_image).labels[LABEL_BASE_IMAGE]
        yield tag
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(tag)
        client.close()
        shutil.rmtree(source.parent, ignore_errors=True)


class HostContainer:
    """The bot's container, started with the documented flags; its logs tell why a wait failed."""

    def __init__(self, image: str, name: str, env_file: Path, data_dir: Path, metrics_port: int) -> None:
        self.image, self.name, self.env_file, self.data_dir = image, name, env_file, data_dir
        self.metrics_port = metrics_port

    def start(self) -> None:
        settings = ["--env-file", str(self.env_file), "-e", f"DATA_DIR={self.data_dir}"]
        settings += ["-e", f"METRICS_ADDR=127.0.0.1:{self.metrics_port}"]
        mounts = ["-v", f"{self.data_dir}:{self.data_dir}", "-v", f"{engine_socket()}:/var/run/docker.sock"]
        test_only = ["--label", f"{TEST_LABEL}=host-image", "--health-interval", HEALTH_INTERVAL]
        command = ["docker", "run", "-d", "--name", self.name, *settings, *mounts, "--network", "host", *test_only]
        started = run([*command, self.image])
        assert started.returncode == 0, started.stderr

    def state(self) -> dict[str, Any]:
        client = docker.from_env()
        try:
            return dict(client.containers.get(self.name).attrs["State"])
        finally:
            client.close()

    def logs(self) -> str:
        done = run(["docker", "logs", "--tail", "60", self.name])
        return done.stdout + done.stderr

    def until(self, what: str, check: Callable[[], T | None], timeout_seconds: float) -> T:
        """`check`'s first non-None value while the container runs; else fail with its logs."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            found = check()
            if found is not None:
                return found
            running = self.state()["Running"]
            if not running or time.monotonic() > deadline:
                state = "running" if running else "exited"
                raise AssertionError(f"timed out waiting for {what} (container {state}); its logs:\n{self.logs()}")
            time.sleep(POLL_SECONDS)

    def remove(self) -> None:
        run(["docker", "rm", "-f", self.name])


def scripted_llm(body: JsonDict) -> JsonDict:
    """The main agent spawns the task, then says so; the subagent runs it in bash, then reports its output."""
    tools = {tool["function"]["name"] for tool in body.get("tools", [])}
    returned = [str(message.get("content")) for message in body["messages"] if message.get("role") == "tool"]
    if "spawn_subagent" in tools:
        return openai_text("On it.") if returned else openai_tool_call("spawn_subagent", {"task": TASK})
    if "bash" in tools:
        return openai_tool_call("bash", {"command": TASK}) if not returned else openai_text(f"Shell: {returned[-1]}")
    return openai_text("nothing to do")


def remove_as_root(path: Path, image: str) -> None:
    """What the bot (root) and its subagents (uid 1000) wrote, removed by root in a container."""
    parent = path.parent
    mount = ["-v", f"{parent}:{parent}", "--label", f"{TEST_LABEL}=host-image-cleanup"]
    removed = run(["docker", "run", "--rm", "--network", "none", *mount, "--entrypoint", "rm", image, "-rf", str(path)])
    assert removed.returncode == 0, removed.stderr


def chat_containers(chat_id: int) -> list[Any]:
    client = docker.from_env()
    try:
        return list(client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_CHAT_ID}={chat_id}"}))
    finally:
        client.close()


def test_the_host_image_runs_a_subagent_whose_result_reaches_the_chat(host_image: str, tmp_path: Path) -> None:
    chat_id = -(3_000_000_000 + secrets.randbelow(900_000_000))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    bot = HostContainer(host_image, f"crewbot-host-test-{secrets.token_hex(4)}", tmp_path / "bot.env", data_dir, 0)
    with FakeTelegram() as tg, FakeLLM(api_key=KEY) as llm:
        llm.openai.handle_with(scripted_llm)
        tg.add_chat(chat_id, title="host image")
        bot.env_file.write_text(
            f"TELEGRAM_BOT_TOKEN={tg.token}\nTELEGRAM_API_BASE_URL={tg.base_url}\nALLOWED_CHAT_IDS={chat_id}\n"
            f"LLM_PROVIDER=openai\nLLM_BASE_URL={llm.base_url}\nLLM_API_KEY={KEY}\nLLM_MODEL=fake-model\n"
            "MERGE_WINDOW_SECONDS=0\nSUBAGENT_IMAGE=crewbot-agent:latest\n"
        )
        bot.metrics_port = free_port()
        try:
            bot.start()
            health = bot.until(
                "the image's health check to pass",
                lambda: (bot.state().get("Health") or {}).get("Status") == "healthy" or None,
                HEALTHY_WAIT_SECONDS,
            )
            doctor = run(["docker", "exec", bot.name, "crewbot", "doctor"])

            tg.push_message(chat_id, f"@{tg.bot_username} please work out six times seven in a shell")
            result = bot.until(
                "the subagent's result in the chat",
                lambda: next((m.plain_text for m in tg.sent_messages(chat_id) if "[Task:" in m.plain_text), None),
                RESULT_WAIT_SECONDS,
            )
            bot.until("the run's container to be removed", lambda: not chat_containers(chat_id) or None, 60.0)
            stopped = run(["docker", "stop", "--time", str(STOP_GRACE_SECONDS), bot.name])
            exit_code = bot.state()["ExitCode"]
        finally:
            logs = bot.logs()
            bot.remove()
            for container in chat_containers(chat_id):
                container.remove(force=True)
            remove_as_root(data_dir, host_image)

    assert health is True
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    for check in ("database", "telegram", "llm", "docker", "image", "container"):
        assert any(line.startswith(f"ok   {check} ") for line in lines), doctor.stdout
    assert any(line.startswith("ok   image ") and ": current;" in line for line in lines), doctor.stdout
    assert result.startswith("Crew: [Task: echo computed-") and "Shell:" in result, result
    assert "computed-42" in result, result
    # The key reached the provider on every call (the main agent's and, through the run's proxy, the subagent's).
    calls = llm.requests("/v1/chat/completions")
    assert len(calls) >= 4 and all(call.headers.get("authorization") == f"Bearer {KEY}" for call in calls)
    assert stopped.returncode == 0 and exit_code == 0, f"exit code {exit_code}; logs:\n{logs}"
    assert not data_dir.exists()
