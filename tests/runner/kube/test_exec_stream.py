"""The exec stream against a real cluster (KUBECONFIG; skipped without one): `cat` in a busybox pod answers what
is written to its stdin, megabytes of it; stderr and the exit status are surfaced; a pod that is not there is a
clear refusal. Then the whole bridged channel: the subagent image's `python -m container.bridge` in a pod, a
PodBridge on this stream, and the agent's plain http.client in the pod reaching an aiohttp server on the host."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client, watch

from container.contract import BRIDGE_MODULE, BRIDGE_TARGET_RUN, CHANNEL_DIR, CHANNEL_SOCKET_FILE
from runner.kube.exec_stream import DEFAULT_CONTAINER, ExecFailed, ExecStream, exec_url, open_exec
from runner.kube.pod_bridge import PodBridge
from runner.runtimes.image import DEFAULT_IMAGE

pytestmark = pytest.mark.kubernetes

IMAGE = "crewbot.local/busybox:1.35"  # built into the test cluster (../shared/kube)
AGENT_PYTHON = "/opt/venv/bin/python"  # the subagent image's (`make test-kubernetes` loads it into the node)
BIG_BYTES = 20 * 1024 * 1024
GVISOR = "gvisor"  # the kit's RuntimeClass
POD_RUNNING_SECONDS = 120
WAIT_SECONDS = 60.0


def _create_and_wait(
    core: client.CoreV1Api, namespace: str, name: str, *, image: str = IMAGE, runtime_class: str | None = None
) -> None:
    """A pod that sleeps, its container named as the agent's, an emptyDir at the channel folder; until it runs."""
    container = client.V1Container(
        name=DEFAULT_CONTAINER,
        image=image,
        image_pull_policy="Never",
        command=["sleep", "3600"] if image == IMAGE else [AGENT_PYTHON, "-c", "import time; time.sleep(3600)"],
        volume_mounts=[client.V1VolumeMount(name="channel", mount_path=CHANNEL_DIR)],
    )
    spec = client.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        automount_service_account_token=False,
        termination_grace_period_seconds=0,
        volumes=[client.V1Volume(name="channel", empty_dir=client.V1EmptyDirVolumeSource())],
        runtime_class_name=runtime_class,
    )
    core.create_namespaced_pod(namespace, client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec))
    watcher = watch.Watch()
    for event in watcher.stream(
        core.list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={name}",
        timeout_seconds=POD_RUNNING_SECONDS,
    ):
        if event["object"].status.phase == "Running":
            watcher.stop()
            return
    raise AssertionError(f"pod {name} was not running within {POD_RUNNING_SECONDS} s")


@pytest.fixture(scope="module")
def pod(kube_target: Any) -> Any:
    """A running busybox pod (its container named as the agent's); deleted at the end."""
    core = client.CoreV1Api(kube_target.api)
    name = f"exec-{secrets.token_hex(4)}"
    _create_and_wait(core, kube_target.namespace, name)
    yield name
    core.delete_namespaced_pod(name, kube_target.namespace, grace_period_seconds=0)


@pytest.fixture
async def cat(kube_target: Any, pod: str) -> AsyncIterator[ExecStream]:
    stream = await open_exec(kube_target.api.configuration, kube_target.namespace, pod, ["cat"])
    yield stream
    await stream.close()


async def test_cat_answers_what_is_written(cat: ExecStream) -> None:
    await cat.write(b"hello\n")
    async with asyncio.timeout(WAIT_SECONDS):
        assert await cat.reader.readexactly(6) == b"hello\n"


async def test_megabytes_go_through_with_backpressure(cat: ExecStream) -> None:
    body = os.urandom(8 * 1024 * 1024)

    async def send() -> None:
        for start in range(0, len(body), 64 * 1024):
            await cat.write(body[start : start + 64 * 1024])

    sending = asyncio.create_task(send())
    async with asyncio.timeout(WAIT_SECONDS):
        received = await cat.reader.readexactly(len(body))
        await sending
    assert received == body


async def test_stderr_and_the_exit_status_are_surfaced(kube_target: Any, pod: str) -> None:
    command = ["sh", "-c", "echo oops >&2; exit 3"]
    stream = await open_exec(kube_target.api.configuration, kube_target.namespace, pod, command)
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            assert await stream.reader.read() == b""  # stdout ends with the command
            await stream.wait_closed()
        assert stream.exit_code == 3
        assert b"oops" in stream.stderr_tail
        assert "oops" in stream.describe()
    finally:
        await stream.close()


async def test_a_pod_that_is_not_there_is_refused(kube_target: Any) -> None:
    with pytest.raises(ExecFailed, match=r"HTTP 404"):
        await open_exec(kube_target.api.configuration, kube_target.namespace, "no-such-pod", ["cat"])


def test_each_argument_is_its_own_command_parameter() -> None:
    configuration = client.Configuration()
    configuration.host = "https://127.0.0.1:16443/"
    url = exec_url(configuration, "ns", "pod-1", ["python", "-m", "a b&c"], "agent")
    assert url.path == "/api/v1/namespaces/ns/pods/pod-1/exec"
    assert url.query.getall("command") == ["python", "-m", "a b&c"]
    assert (url.query["container"], url.query["stdin"], url.query["stdout"]) == ("agent", "true", "true")


@pytest.fixture(scope="module", params=[None, GVISOR], ids=["runc", "gvisor"])
def agent_pod(kube_target: Any, request: pytest.FixtureRequest) -> Any:
    """The subagent image in a pod, under runc and under gVisor (its own netstack: exec still reaches in)."""
    if request.param is not None:
        try:
            client.NodeV1Api(kube_target.api).read_runtime_class(request.param)
        except client.ApiException as exc:
            pytest.skip(f"the cluster has no RuntimeClass {request.param!r} ({exc.status})")
    core = client.CoreV1Api(kube_target.api)
    name = f"bridge-{secrets.token_hex(4)}"
    _create_and_wait(core, kube_target.namespace, name, image=DEFAULT_IMAGE, runtime_class=request.param)
    yield name
    core.delete_namespaced_pod(name, kube_target.namespace, grace_period_seconds=0)


# Run in the pod: the agent's way to its channel (http.client over the run socket), 20 MB each way.
AGENT_SCRIPT = f"""
import http.client, socket, time
class Connection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("{CHANNEL_DIR}/{CHANNEL_SOCKET_FILE}")
for _ in range(300):  # the bridge listens once its HELLO has come
    try:
        c = Connection("run"); c.request("GET", "/hello"); print(c.getresponse().read().decode()); break
    except OSError:
        time.sleep(0.1)
body = bytes(range(256)) * {BIG_BYTES // 256}
c = Connection("run"); c.request("POST", "/echo", body=body); answer = c.getresponse().read()
print("echoed" if answer == body else f"echo differs: {{len(answer)}} bytes")
"""


async def test_the_bridge_in_a_pod_carries_the_agent_to_the_host(
    kube_target: Any, agent_pod: str, tmp_path: Path
) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello from the host")

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application(client_max_size=2 * BIG_BYTES)
    app.router.add_get("/hello", hello)
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, os.fspath(tmp_path / CHANNEL_SOCKET_FILE)).start()
    configuration, namespace = kube_target.api.configuration, kube_target.namespace
    bridge_command = [AGENT_PYTHON, "-P", "-m", BRIDGE_MODULE]

    async def opener() -> ExecStream:
        return await open_exec(configuration, namespace, agent_pod, bridge_command)

    bridge = PodBridge("run-kube", opener, {BRIDGE_TARGET_RUN: tmp_path / CHANNEL_SOCKET_FILE})
    running = asyncio.create_task(bridge.run())
    try:
        agent = await open_exec(configuration, namespace, agent_pod, [AGENT_PYTHON, "-c", AGENT_SCRIPT])
        try:
            async with asyncio.timeout(WAIT_SECONDS):
                output = await agent.reader.read()
                await agent.wait_closed()
        finally:
            await agent.close()
        assert output.decode().split() == ["hello", "from", "the", "host", "echoed"], agent.describe()
        assert agent.exit_code == 0
    finally:
        await bridge.close()
        await running
        await runner.cleanup()
