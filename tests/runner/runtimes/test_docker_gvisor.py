"""SUBAGENT_RUNTIME_CLASS on the real engine: a container under runsc runs on gVisor's kernel with every
hardening of the runc ones, a kill ends it at once, a host Unix socket bind-mounted in is reachable (the run
channel), and a runtime the engine does not know is a start error that says how to register it."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from runner.runtimes.docker_runtime import DockerRuntime, UnknownRuntimeClass, create_options
from runner.runtimes.runtime import ContainerSpec, Mount
from runner.storage.paths import CONTAINER_GID, CONTAINER_UID
from tests.runner.docker_helpers import TEST_LABEL
from tests.runner.gvisor_helpers import GVISOR_PIDS, RUNSC, require_runsc
from tests.runner.runtimes import test_docker_runtime
from tests.runner.runtimes.test_docker_runtime import make_spec

sh_image = test_docker_runtime.sh_image  # the session fixture of the tiny busybox image, shared

SIGKILL_EXIT_CODE = 137
MIB = 1024 * 1024
WAIT_SECONDS = 60.0
KILL_WAIT_SECONDS = 10.0  # "at once": SIGKILL of the sandbox, not a grace period (the bench measures it)
GVISOR_KERNEL = "Linux version 4.4.0"  # what gVisor's /proc/version reports, whatever the host runs


def gvisor_spec(image: str, label: str, command: list[str], **overrides: Any) -> ContainerSpec:
    return make_spec(image, label, command, runtime_class=RUNSC, pids=GVISOR_PIDS, **overrides)


@pytest.fixture
def gvisor(docker_engine: None) -> None:
    require_runsc()


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    path.chmod(0o777)  # the container runs as uid 1000, the test as whoever
    return path


def test_runtime_class_is_the_engines_runtime_and_absent_by_default() -> None:
    spec = make_spec("image", "label", ["true"])
    assert "runtime" not in create_options(spec)
    assert create_options(make_spec("image", "label", ["true"], runtime_class=RUNSC))["runtime"] == RUNSC


@pytest.mark.docker
async def test_runs_on_gvisors_kernel_with_every_hardening(
    runtime: DockerRuntime, sh_image: str, run_label: str, workspace: Path, engine: docker.DockerClient, gvisor: None
) -> None:
    script = (
        "cat /proc/version; id -u; "
        "touch /rootfile 2>/dev/null && echo root-writable || echo root-readonly; "
        "touch /tmp/t && echo tmp-writable; "
        "touch /workspace/w && echo workspace-writable; "
        "grep CapEff /proc/self/status; "
        "grep ' /tmp ' /proc/mounts; "
        "echo net=$(ls /sys/class/net)"
    )
    spec = gvisor_spec(sh_image, run_label, ["sh", "-c", script], mounts=[Mount(workspace, "/workspace")])
    container_id = await runtime.start(spec)

    host = engine.api.inspect_container(container_id)["HostConfig"]
    assert host["Runtime"] == RUNSC
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["Privileged"] is False
    assert host["PidsLimit"] == GVISOR_PIDS and host["Memory"] == 64 * MIB and host["NetworkMode"] == "none"
    assert await runtime.wait(container_id, WAIT_SECONDS) == 0
    lines = (await runtime.logs(container_id)).decode().splitlines()
    assert lines[0].startswith(GVISOR_KERNEL) and os.uname().release not in lines[0]  # not the host's kernel
    assert lines[1] == "1000"
    assert lines[2:5] == ["root-readonly", "tmp-writable", "workspace-writable"]
    assert lines[5].split() == ["CapEff:", "0000000000000000"]
    assert "noexec" in lines[6].split()[3].split(",")
    assert lines[7] == "net=lo"  # loopback only
    assert (workspace / "w").exists()


@pytest.mark.docker
async def test_memory_limit_is_enforced(
    runtime: DockerRuntime, subagent_image: str, run_label: str, gvisor: None
) -> None:
    grab = (
        "chunks = []\n"
        "for i in range(32):\n"
        "    chunks.append(b'x' * (16 * 1024 * 1024))\n"
        "    print((i + 1) * 16, flush=True)\n"
    )
    spec = gvisor_spec(
        subagent_image, run_label, ["-c", grab], entrypoint=["/opt/venv/bin/python"], memory="128m", workdir="/tmp"
    )
    container_id = await runtime.start(spec)

    assert await runtime.wait(container_id, WAIT_SECONDS) == SIGKILL_EXIT_CODE
    reached = [int(line) for line in (await runtime.logs(container_id)).decode().split()]
    assert reached and max(reached) <= 128  # MiB: killed at the limit, not at the 512 it asked for


@pytest.mark.docker
async def test_pids_limit_stops_a_fork_bomb(
    runtime: DockerRuntime, sh_image: str, run_label: str, gvisor: None
) -> None:
    bomb = "i=0; while [ $i -lt 1000 ]; do sleep 30 & i=$((i+1)); echo $i; done; echo all-started"
    container_id = await runtime.start(gvisor_spec(sh_image, run_label, ["sh", "-c", bomb]))

    code = await runtime.wait(container_id, 5)
    if code is None:  # the shell may survive its failed forks: end it
        await runtime.kill(container_id)
        code = await runtime.wait(container_id, KILL_WAIT_SECONDS)
    output = (await runtime.logs(container_id)).decode()
    assert code != 0 and "all-started" not in output
    assert int(output.split()[-1]) < GVISOR_PIDS  # the limit held: far fewer than 1000 processes


@pytest.mark.docker
async def test_kill_ends_it_at_once(runtime: DockerRuntime, sh_image: str, run_label: str, gvisor: None) -> None:
    stubborn = ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]  # only SIGKILL ends it
    container_id = await runtime.start(gvisor_spec(sh_image, run_label, stubborn))
    assert await runtime.wait(container_id, 1) is None

    await runtime.kill(container_id)
    assert await runtime.wait(container_id, KILL_WAIT_SECONDS) == SIGKILL_EXIT_CODE
    await runtime.remove(container_id)
    assert await runtime.inspect(container_id) is None


@pytest.mark.docker
async def test_a_bind_mounted_host_socket_is_reachable(
    runtime: DockerRuntime, subagent_image: str, run_label: str, tmp_path: Path, gvisor: None
) -> None:
    """The run channel is a host Unix socket in a read-only bind mount: gVisor needs --host-uds=open for it."""
    channel = tmp_path / "channel"
    channel.mkdir()
    if os.getuid() == 0:
        os.chown(channel, CONTAINER_UID, CONTAINER_GID)
    token = secrets.token_hex(8)
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await received.put(await reader.read(64))
        writer.close()

    server = await asyncio.start_unix_server(handle, path=str(channel / "s.sock"))
    os.chmod(channel / "s.sock", 0o666)
    connect = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); "
        "s.connect('/ch/s.sock'); s.sendall(sys.argv[1].encode())"
    )
    spec = gvisor_spec(
        subagent_image,
        run_label,
        ["-c", connect, token],
        entrypoint=["/opt/venv/bin/python"],
        mounts=[Mount(channel, "/ch", read_only=True)],
        memory="256m",
        workdir="/tmp",
    )
    try:
        container_id = await runtime.start(spec)
        code = await runtime.wait(container_id, WAIT_SECONDS)
        assert code == 0, (await runtime.logs(container_id)).decode()
        assert await asyncio.wait_for(received.get(), 5) == token.encode()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.docker
async def test_an_unknown_runtime_says_how_to_register_it(
    runtime: DockerRuntime, sh_image: str, run_label: str, engine: docker.DockerClient
) -> None:
    spec = make_spec(sh_image, run_label, ["true"], runtime_class="crewbot-no-such-runtime")

    with pytest.raises(UnknownRuntimeClass) as raised:
        await runtime.start(spec)
    message = str(raised.value)
    assert "the engine has no runtime 'crewbot-no-such-runtime' (SUBAGENT_RUNTIME_CLASS" in message
    assert "`make engine`" in message and "daemon.json" in message and "unset SUBAGENT_RUNTIME_CLASS" in message
    assert engine.containers.list(all=True, filters={"label": f"{TEST_LABEL}={run_label}"}) == []
