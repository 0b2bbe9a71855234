"""What the bridge benchmark drives: a pod of the subagent image with this tree's container/ code in it, a byte
server on a host Unix socket, and one client script that the pod and the host both run.

- `BridgePod`: a pod (the subagent image, `sleep`; emptyDirs at the channel folder and at CODE_DIR), and this
  tree's `container/*.py` shipped into CODE_DIR over an exec's stdin, so the bridge measured is this tree's,
  whatever version of the image the node has.
- `ByteServer`: a Unix socket server in threads of this process (blocking 1 MiB writes and reads, so the
  event loop carrying the bridge is not its loop): a connection says `down N` (it is sent N bytes, then the
  end) or `up N` (it sends N bytes and is answered `ok`).
- CLIENT: the script on both sides. It reads `down N` / `up N` lines on stdin, makes one connection to the
  socket for each, and prints the seconds from its connect to the last byte (down) or to the answer (up).
- EXEC_ECHO: the bare exec stream's far end: `down N` reads N bytes from its stdin and answers `ok`, `up N`
  writes N bytes to its stdout; no bridge, no mux.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import socket
import tarfile
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kubernetes import client, watch

from bench.thread_server import ThreadServer
from runner.kube.exec_stream import DEFAULT_CONTAINER, ExecStream, open_exec

IMAGE = "crewbot-agent:latest"
PYTHON = "/opt/venv/bin/python"  # the subagent image's
CODE_DIR = "/tmp/bench-code"
POD_RUNNING_SECONDS = 120
WAIT_SECONDS = 120.0
BLOCK_BYTES = 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parent.parent

CLIENT = """
import socket, sys, time
path = sys.argv[1]
block = bytes(1 << 20)
for line in sys.stdin:
    mode, count = line.split(); count = int(count)
    for _ in range(600):  # the bridge listens once its HELLO has come
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.connect(path); break
        except OSError:
            sock.close(); time.sleep(0.05)
    started = time.perf_counter()
    sock.sendall(f"{mode} {count}\\n".encode())
    if mode == "down":
        got = 0
        buffer = bytearray(1 << 20)
        while n := sock.recv_into(buffer):
            got += n
        assert got == count, got
    else:
        left = count
        while left:
            left -= sock.send(block[: min(left, len(block))])
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(16) == b"ok", "no answer"
    print(time.perf_counter() - started, flush=True)
    sock.close()
"""

EXEC_ECHO = """
import sys
block = bytes(1 << 20)
out, inp = sys.stdout.buffer, sys.stdin.buffer
while line := inp.readline():
    mode, count = line.split(); count = int(count)
    if mode == b"down":  # host to pod: read them from stdin, then answer
        while count:
            count -= len(inp.read(min(count, 1 << 20)))
        out.write(b"ok"); out.flush()
    else:  # pod to host: write them to stdout
        while count:
            out.write(block[: min(count, len(block))]); count -= min(count, len(block))
        out.flush()
"""

SHIP_CODE = f"""
import io, sys, tarfile
size = int(sys.stdin.buffer.readline())
data = sys.stdin.buffer.read(size)
tarfile.open(fileobj=io.BytesIO(data)).extractall({CODE_DIR!r})
print("shipped", flush=True)
"""

# The bridge from CODE_DIR, ahead of whatever container/ the image holds.
BRIDGE = (
    f"import sys, runpy; sys.path.insert(0, {CODE_DIR!r}); runpy.run_module('container.bridge', run_name='__main__')"
)


def _code_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted((REPO_ROOT / "container").glob("*.py")):
            tar.add(path, arcname=f"container/{path.name}")
    return buffer.getvalue()


class BridgePod:
    """A running pod of the subagent image with this tree's container/ code in CODE_DIR; deleted at the end."""

    def __init__(self, api: client.ApiClient, namespace: str, channel_dir: str) -> None:
        self._api = api
        self.configuration = api.configuration
        self.namespace = namespace
        self._channel_dir = channel_dir
        self.name = f"bridge-{secrets.token_hex(4)}"

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self._create)
        shipped = await self.exec([PYTHON, "-c", SHIP_CODE])
        try:
            tar = _code_tar()
            await shipped.write(f"{len(tar)}\n".encode() + tar)
            async with asyncio.timeout(WAIT_SECONDS):
                said = await shipped.reader.readline()
            if said != b"shipped\n":
                raise RuntimeError(f"the code did not reach the pod: {said!r} ({shipped.describe()})")
        finally:
            await shipped.close()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        core = client.CoreV1Api(self._api)
        await asyncio.to_thread(core.delete_namespaced_pod, self.name, self.namespace, grace_period_seconds=0)

    async def exec(self, command: list[str]) -> ExecStream:
        return await open_exec(self.configuration, self.namespace, self.name, command)

    def _create(self) -> None:
        core = client.CoreV1Api(self._api)
        container = client.V1Container(
            name=DEFAULT_CONTAINER,
            image=IMAGE,
            image_pull_policy="Never",
            command=[PYTHON, "-c", "import time; time.sleep(3600)"],
            volume_mounts=[
                client.V1VolumeMount(name="channel", mount_path=self._channel_dir),
                client.V1VolumeMount(name="code", mount_path=CODE_DIR),
            ],
        )
        spec = client.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            automount_service_account_token=False,
            termination_grace_period_seconds=0,
            volumes=[
                client.V1Volume(name="channel", empty_dir=client.V1EmptyDirVolumeSource()),
                client.V1Volume(name="code", empty_dir=client.V1EmptyDirVolumeSource()),
            ],
        )
        core.create_namespaced_pod(
            self.namespace, client.V1Pod(metadata=client.V1ObjectMeta(name=self.name), spec=spec)
        )
        watcher = watch.Watch()
        stream: Any = watcher.stream(
            core.list_namespaced_pod,
            self.namespace,
            field_selector=f"metadata.name={self.name}",
            timeout_seconds=POD_RUNNING_SECONDS,
        )
        for event in stream:
            if event["object"].status.phase == "Running":
                watcher.stop()
                return
        raise RuntimeError(f"pod {self.name} was not running within {POD_RUNNING_SECONDS} s")


class ByteServer:
    """`down N` / `up N` on a Unix socket at `path`, a thread per connection; from `with` until its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._server = ThreadServer("byte-server", connection_timeout=WAIT_SECONDS)

    def __enter__(self) -> Self:
        self._server.__enter__()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.fspath(self.path))
        self._server.serve(listener, _serve)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.__exit__(exc_type, exc, tb)
        self.path.unlink(missing_ok=True)


def _serve(conn: socket.socket) -> None:
    block = bytes(BLOCK_BYTES)
    buffer = bytearray(BLOCK_BYTES)
    try:
        head = b""
        while not head.endswith(b"\n"):
            byte = conn.recv(1)
            if not byte:
                return
            head += byte
        mode, count_text = head.split()
        count = int(count_text)
        if mode == b"down":
            while count:
                count -= conn.send(block[: min(count, BLOCK_BYTES)])
        else:
            while count and (got := conn.recv_into(buffer, min(count, BLOCK_BYTES))):
                count -= got
            conn.sendall(b"ok")
    except OSError:
        pass
    finally:
        conn.close()
