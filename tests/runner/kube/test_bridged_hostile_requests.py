"""The second review's reproductions on the Kubernetes backend's path, without a cluster: sent by a "pod" into
the real bridge process (`python -m container.bridge`), carried by a real PodBridge to the run's real socket
(the proxy with the run's inbox, as the task manager opens it). They meet the same rules as on Docker: a
deflated preamble (415), a chunked body (411), a preamble (400), each refused from its head or first line and
counted, and the third stops the run."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.contract import BRIDGE_TARGET_RUN
from container.protocol import CHANNEL_SOCKET_FILE, MESSAGE_PATH
from runner.kube.pod_bridge import ByteStream, PodBridge
from runner.runs.live_runs import StopReason
from tests.container.bridge_helpers import BridgeProcess
from tests.runner.channel.file_desk_rig import BOUNDARY, DeskRig, desk_rig, file_part, meta_part, multipart
from tests.runner.channel.run_api_client import Answer, chunked, exchange_raw

WAIT_SECONDS = 60.0
UPLOAD = multipart(meta_part({"upload_id": "upload-01", "name": "a.txt"}), file_part(b""))


@pytest.fixture
async def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[DeskRig, Path]]:
    """The run's socket on the host, and the pod's end of the bridge to it: the socket a pod's agent uses."""
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    processes: list[BridgeProcess] = []

    async def open_process() -> ByteStream:
        process = await BridgeProcess.start(pod_dir)
        processes.append(process)
        return process

    async with desk_rig(tmp_path, monkeypatch) as rig:
        bridge = PodBridge("run-1", open_process, {BRIDGE_TARGET_RUN: rig.socket}, retry_delays_seconds=(0.05,))
        task = asyncio.create_task(bridge.run())
        try:
            async with asyncio.timeout(WAIT_SECONDS):
                await bridge.wait_for(lambda b: b.sessions >= 1)
            await processes[0].wait_listening()
            yield rig, pod_dir / CHANNEL_SOCKET_FILE
        finally:
            await bridge.close()
            await task
            for process in processes:
                await process.close()


async def send(socket: Path, path: str, headers: list[str], body: bytes) -> Answer:
    lines = [f"POST {path} HTTP/1.1", "Host: run", "Connection: close", *headers]
    pieces = [body[start : start + 65_536] for start in range(0, len(body), 65_536)]
    return await exchange_raw(socket, ("\r\n".join(lines) + "\r\n\r\n").encode(), pieces)


async def test_the_reproductions_through_the_bridge_are_refused_and_counted(pod: tuple[DeskRig, Path]) -> None:
    rig, socket = pod
    multipart_type = f"Content-Type: multipart/form-data; boundary={BOUNDARY}"

    deflated = zlib.compress(b"\n" * (8 << 20) + UPLOAD, 9)
    answer = await send(
        socket,
        "/run/files",
        [multipart_type, "Content-Encoding: deflate", f"Content-Length: {len(deflated)}"],
        deflated,
    )
    assert (answer.status, rig.invalid_count) == (415, 1)

    message = b'{"message_id": "msg-0001", "text": "' + b"x" * 2_000 + b'"}'
    answer = await send(socket, MESSAGE_PATH, ["Transfer-Encoding: chunked"], b"".join(chunked(message, 1)))
    assert (answer.status, rig.invalid_count) == (411, 2)
    assert rig.live.stop_reason is None

    # Small enough to be sent whole before the host refuses it: a body the host stops reading part-way breaks
    # the bridged stream's way up, and the bridge then resets the stream with the host's answer (a race of the
    # mux, container/mux.py _carry, not of these rules; the container's own client never sends such a body).
    preamble = b"\n" * 4_000 + UPLOAD
    answer = await send(socket, "/run/files", [multipart_type, f"Content-Length: {len(preamble)}"], preamble)
    assert (answer.status, rig.invalid_count) == (400, 3)
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS
