"""DockerRuntime against the real engine: hardening reaches the engine, wait/kill/logs/list behave."""

from __future__ import annotations

import io
import os
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from runner.runtimes.docker_info import parse_docker_time
from runner.runtimes.docker_runtime import TMPFS_MOUNTPOINT, DockerRuntime
from runner.runtimes.runtime import (
    LABEL_APP,
    ContainerGone,
    ContainerSpec,
    ContainerStartError,
    Mount,
    RuntimeUnavailable,
    container_name,
)
from tests.runner.docker_helpers import TEST_LABEL

TEST_IMAGE = "crewbot-test-busybox:latest"
# Built from Debian's busybox-static, which `make test` installs (scripts/test-deps.sh). No fallback to
# another image: the project's images have an entrypoint that ignores the command these tests run.
STATIC_BUSYBOX = Path("/bin/busybox")
BUSYBOX_APPLETS = ("sh", "sleep", "echo", "cat", "id", "ls", "touch", "true", "false", "grep")
CONTAINER_USER = "1000:1000"
SIGKILL_EXIT_CODE = 137
MIB = 1024 * 1024


def _busybox_rootfs_tar(busybox: Path) -> bytes:
    """A minimal root filesystem: a statically linked busybox and symlinks for the applets the tests use."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        # The tmpfs on /tmp takes the mode of the image's /tmp: world-writable and sticky, as in Debian.
        for directory, mode in (("bin", 0o755), ("tmp", 0o1777), ("workspace", 0o755)):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in BUSYBOX_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            tar.addfile(info)
    return buffer.getvalue()


def _is_static(binary: Path) -> bool:
    # A dynamically linked ELF names its loader (ld-linux, ld-musl) near the start; a static one does not.
    if not binary.is_file():
        return False
    head = binary.read_bytes()[:4096]
    return b"ld-linux" not in head and b"ld-musl" not in head


@pytest.fixture(scope="session")
def sh_image(docker_engine: None) -> str:
    """A tiny image with sh, built once from the host's static busybox."""
    client = docker.from_env()
    try:
        try:
            client.images.get(TEST_IMAGE)
            return TEST_IMAGE
        except docker.errors.ImageNotFound:
            if _is_static(STATIC_BUSYBOX):
                repository, tag = TEST_IMAGE.split(":")
                client.api.import_image_from_data(_busybox_rootfs_tar(STATIC_BUSYBOX), repository=repository, tag=tag)
                return TEST_IMAGE
    finally:
        client.close()
    reason = (
        f"no test image {TEST_IMAGE}: it is built from a static {STATIC_BUSYBOX}, missing or not static here; "
        "`make test` installs it (scripts/test-deps.sh), or as root: apt-get install busybox-static"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: Docker tests must not skip)")
    pytest.skip(reason)


@pytest.fixture
def inspect() -> Iterator[Any]:
    client = docker.from_env()
    yield lambda container_id: client.api.inspect_container(container_id)
    client.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    path.chmod(0o777)  # the container runs as uid 1000, the test as whoever
    return path


def make_spec(
    image: str, label: str, command: list[str], mounts: list[Mount] | None = None, **overrides: Any
) -> ContainerSpec:
    run_id = f"test-{uuid.uuid4().hex[:10]}"
    fields: dict[str, Any] = {
        "name": container_name(run_id),
        "image": image,
        "command": command,
        "labels": {TEST_LABEL: label, "crewbot.run_id": run_id},
        "mounts": mounts or [],
        "user": CONTAINER_USER,
        "workdir": "/",
        "memory": "64m",
        "cpus": 0.5,
        "pids": 64,
    }
    fields.update(overrides)
    return ContainerSpec(**fields)


@pytest.mark.docker
async def test_start_applies_every_limit(
    runtime: DockerRuntime, sh_image: str, run_label: str, workspace: Path, inspect: Any
) -> None:
    spec = make_spec(
        sh_image,
        run_label,
        ["sleep", "30"],
        mounts=[Mount(workspace, "/workspace"), Mount(workspace, "/ro", read_only=True)],
        workdir="/workspace",
        environment={"CREWBOT_RUN": "1"},
    )
    container_id = await runtime.start(spec)

    attrs = inspect(container_id)
    host = attrs["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == 64
    assert host["Memory"] == 64 * MIB
    assert host["MemorySwap"] == 64 * MIB
    assert host["NanoCpus"] == 500_000_000
    assert host["NetworkMode"] == "none"
    assert host["Init"] is True
    assert host["AutoRemove"] is False
    assert host["Privileged"] is False
    assert host["Tmpfs"] == {TMPFS_MOUNTPOINT: "rw,noexec,nosuid,nodev,size=64m"}
    assert host["LogConfig"]["Type"] == "json-file"
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert mounts["/workspace"]["Type"] == "bind" and mounts["/workspace"]["RW"] is True
    assert mounts["/ro"]["RW"] is False
    config = attrs["Config"]
    assert config["User"] == CONTAINER_USER
    assert config["WorkingDir"] == "/workspace"
    assert "HOME=/tmp" in config["Env"] and "CREWBOT_RUN=1" in config["Env"]
    assert config["Labels"][LABEL_APP] == "1" and config["Labels"][TEST_LABEL] == run_label
    assert attrs["Name"] == f"/{spec.name}"


@pytest.mark.docker
async def test_limits_hold_inside_the_container(
    runtime: DockerRuntime, sh_image: str, run_label: str, workspace: Path
) -> None:
    script = (
        "id -u; "
        "touch /rootfile 2>/dev/null && echo root-writable || echo root-readonly; "
        "touch /tmp/t && echo tmp-writable; "
        "touch /workspace/w && echo workspace-writable; "
        "grep CapEff /proc/self/status; "
        "grep ' /tmp ' /proc/mounts; "
        "ls /sys/class/net"
    )
    spec = make_spec(sh_image, run_label, ["sh", "-c", script], mounts=[Mount(workspace, "/workspace")])
    container_id = await runtime.start(spec)

    assert await runtime.wait(container_id, 30) == 0
    lines = (await runtime.logs(container_id)).decode().split()
    assert lines[0] == "1000"
    assert "root-readonly" in lines and "tmp-writable" in lines and "workspace-writable" in lines
    assert "0000000000000000" in lines  # no effective capabilities
    assert "rw,nosuid,nodev,noexec,relatime,size=65536k" in lines  # /tmp as mounted
    assert lines[-1] == "lo"  # network none: loopback only
    assert (workspace / "w").exists()


@pytest.mark.docker
async def test_wait_returns_exit_code_and_logs_hold_both_streams(
    runtime: DockerRuntime, sh_image: str, run_label: str
) -> None:
    spec = make_spec(sh_image, run_label, ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"])
    container_id = await runtime.start(spec)

    assert await runtime.wait(container_id) == 3
    logs = await runtime.logs(container_id)
    assert b"to-stdout" in logs and b"to-stderr" in logs


@pytest.mark.docker
async def test_wait_times_out_with_none_and_leaves_it_running(
    runtime: DockerRuntime, sh_image: str, run_label: str
) -> None:
    container_id = await runtime.start(make_spec(sh_image, run_label, ["sleep", "30"]))

    assert await runtime.wait(container_id, timeout_seconds=0.3) is None
    info = await runtime.inspect(container_id)
    assert info is not None and info.status == "running" and info.exit_code is None
    await runtime.kill(container_id)
    assert await runtime.wait(container_id, 30) == SIGKILL_EXIT_CODE


@pytest.mark.docker
async def test_kill_is_sigkill_and_idempotent(runtime: DockerRuntime, sh_image: str, run_label: str) -> None:
    # The script ignores SIGTERM: only SIGKILL ends it, so a 137 proves kill() did not merely stop().
    stubborn = ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
    container_id = await runtime.start(make_spec(sh_image, run_label, stubborn))

    await runtime.kill(container_id)
    assert await runtime.wait(container_id, 30) == SIGKILL_EXIT_CODE
    await runtime.kill(container_id)  # already exited
    await runtime.remove(container_id)
    await runtime.kill(container_id)  # gone
    await runtime.remove(container_id)
    assert await runtime.logs(container_id) == b""
    assert await runtime.inspect(container_id) is None


@pytest.mark.docker
async def test_wait_on_a_removed_container_raises_gone(runtime: DockerRuntime, sh_image: str, run_label: str) -> None:
    container_id = await runtime.start(make_spec(sh_image, run_label, ["true"]))
    assert await runtime.wait(container_id, 30) == 0
    await runtime.remove(container_id)

    with pytest.raises(ContainerGone, match="no longer exists"):
        await runtime.wait(container_id, 5)


@pytest.mark.docker
async def test_list_by_label(runtime: DockerRuntime, sh_image: str, run_label: str) -> None:
    before = time.time()
    running = make_spec(sh_image, run_label, ["sleep", "30"], labels={TEST_LABEL: run_label, "role": "a"})
    finished = make_spec(sh_image, run_label, ["sh", "-c", "exit 4"], labels={TEST_LABEL: run_label, "role": "b"})
    running_id = await runtime.start(running)
    finished_id = await runtime.start(finished)
    assert await runtime.wait(finished_id, 30) == 4

    everything = {info.id: info for info in await runtime.list({TEST_LABEL: run_label})}
    assert set(everything) == {running_id, finished_id}
    assert everything[running_id].status == "running" and everything[running_id].exit_code is None
    assert everything[running_id].name == running.name
    assert everything[finished_id].status == "exited" and everything[finished_id].exit_code == 4
    started = everything[running_id].started_at
    assert started is not None and before - 5 <= started <= time.time() + 5

    only_b = await runtime.list({TEST_LABEL: run_label, "role": "b"})
    assert [info.id for info in only_b] == [finished_id]
    assert only_b[0].labels[LABEL_APP] == "1"
    assert await runtime.list({TEST_LABEL: "no-such-value"}) == []


@pytest.mark.docker
async def test_missing_image_is_a_start_error(runtime: DockerRuntime, run_label: str) -> None:
    spec = make_spec("crewbot-no-such-image:never", run_label, ["true"])
    with pytest.raises(ContainerStartError, match="crewbot-no-such-image:never"):
        await runtime.start(spec)
    assert await runtime.image_exists("crewbot-no-such-image:never") is False


@pytest.mark.docker
async def test_failed_start_leaves_no_container(runtime: DockerRuntime, sh_image: str, run_label: str) -> None:
    # A user name the image has no passwd entry for: create succeeds, start fails.
    spec = make_spec(sh_image, run_label, ["true"], user="nosuchuser")
    with pytest.raises(ContainerStartError, match="nosuchuser"):
        await runtime.start(spec)
    assert await runtime.list({TEST_LABEL: run_label}) == []


@pytest.mark.docker
async def test_missing_program_is_an_exit_code(runtime: DockerRuntime, sh_image: str, run_label: str) -> None:
    # With init=True the init process execs the command, so a missing program is exit 127, not a start error.
    container_id = await runtime.start(make_spec(sh_image, run_label, ["/no/such/program"]))
    assert await runtime.wait(container_id, 30) == 127
    assert b"/no/such/program" in await runtime.logs(container_id)


@pytest.mark.docker
async def test_image_exists_and_ping(runtime: DockerRuntime, sh_image: str) -> None:
    await runtime.ping()
    assert await runtime.image_exists(sh_image) is True


@pytest.mark.docker
async def test_closed_runtime_refuses_calls(docker_engine: None) -> None:
    rt = DockerRuntime(max_concurrency=1)
    await rt.ping()
    await rt.close()
    with pytest.raises(RuntimeUnavailable, match="closed"):
        await rt.ping()


@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_unreachable_engine_names_the_socket(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"unix://{tmp_path}/no-docker.sock"
    if how == "environment":
        monkeypatch.setenv("DOCKER_HOST", url)
        rt = DockerRuntime(max_concurrency=1)
    else:
        rt = DockerRuntime(max_concurrency=1, base_url=url)
    try:
        with pytest.raises(RuntimeUnavailable) as caught:
            await rt.ping()
        message = str(caught.value)
        assert url in message and "dockerd" in message
        with pytest.raises(RuntimeUnavailable):
            await rt.start(make_spec("any:latest", "x", ["true"]))
    finally:
        await rt.close()


def test_container_name_is_stable() -> None:
    assert container_name("abc123") == "crewbot-run-abc123"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00.123456789Z", 1714564800.123456),
        ("2024-05-01T12:00:00Z", 1714564800.0),
        ("2024-05-01T14:00:00.5+02:00", 1714564800.5),
        ("0001-01-01T00:00:00Z", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_docker_time(text: str | None, expected: float | None) -> None:
    result = parse_docker_time(text)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)
