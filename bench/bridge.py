"""The Kubernetes bridge's throughput: bytes between a pod and a host socket through the bridged run channel, against
the same transfer over a plain Unix socket on the host, and against a bare exec stream (the cluster's part).

Needs KUBECONFIG (the kit in ../shared/kube) and the subagent image on the node; without them it notes why and
reports no rows. One pod of the subagent image, this tree's container/ code shipped into it (bench/bridge_rig.py),
so the pod's bridge is this tree's; the host's end is the product's `PodBridge` over `open_exec`, on this worker's
loop, to a byte server on a Unix socket in threads of this process.

- bridge: the client script in the pod connects to the channel socket, the bridge carries it as a stream over the
  exec to the host's socket; SIZE_BYTES down (host → pod) or up (pod → host). Timed in the pod from its connect
  to the last byte (down) or to the server's answer (up).
- plain socket (the baseline): the same client script on the host, a process of its own, connected to the same
  server straight.
- bare exec: the exec stream alone, no bridge, no mux: a process in the pod writes SIZE_BYTES to its stdout
  (up) or reads them from its stdin (down, written by this process in messages of EXEC_MESSAGE_BYTES); timed
  here. It is what the API server and the kubelet carry at best.
Each round runs every route once, the order rotated.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.bridge_rig import BRIDGE, CLIENT, EXEC_ECHO, PYTHON, WAIT_SECONDS, BridgePod, ByteServer
from bench.common import BenchContext, ms
from bench.kube_cluster import bench_cluster
from bench.report import Measure, Row
from container.contract import BRIDGE_TARGET_RUN, CHANNEL_DIR, CHANNEL_SOCKET_FILE
from runner.kube.exec_stream import ExecStream
from runner.kube.pod_bridge import PodBridge

NAME = "bridge"
MB = 1024 * 1024
SIZE_BYTES = 32 * MB
WARMUP_ROUNDS = 1
READ_BYTES = 1024 * 1024
EXEC_MESSAGE_BYTES = 1024 * 1024  # what the bare exec's stdin gets a message at a time: its best case
DIRECTIONS = ("down", "up")
PLAIN = "the same over a plain Unix socket on the host (the same client script), same round"


@dataclass(slots=True)
class _Lines:
    """A process that answers each line written to it with one line: the client script or the exec's echo."""

    exec_stream: ExecStream | None = None
    process: asyncio.subprocess.Process | None = None

    async def ask(self, line: bytes) -> bytes:
        if self.exec_stream is not None:
            await self.exec_stream.write(line)
            reader = self.exec_stream.reader
        else:
            assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(line)
            await self.process.stdin.drain()
            reader = self.process.stdout
        async with asyncio.timeout(WAIT_SECONDS):
            answer = await reader.readline()
        if not answer.endswith(b"\n"):
            raise RuntimeError(f"the client ended: {answer!r}")
        return answer


async def _client_rate(client: _Lines, direction: str) -> float:
    seconds = float(await client.ask(f"{direction} {SIZE_BYTES}\n".encode()))
    return (SIZE_BYTES / MB) / seconds


async def _exec_rate(echo: ExecStream, direction: str) -> float:
    started = time.perf_counter()
    await echo.write(f"{direction} {SIZE_BYTES}\n".encode())
    async with asyncio.timeout(WAIT_SECONDS):
        if direction == "down":
            block = bytes(EXEC_MESSAGE_BYTES)
            for start in range(0, SIZE_BYTES, len(block)):
                await echo.write(block[: min(len(block), SIZE_BYTES - start)])
            if await echo.reader.readexactly(2) != b"ok":
                raise RuntimeError("the exec's echo did not answer")
        else:
            left = SIZE_BYTES
            while left:
                chunk = await echo.reader.read(min(left, READ_BYTES))
                if not chunk:
                    raise RuntimeError(f"the exec ended {left} bytes short: {echo.describe()}")
                left -= len(chunk)
    return (SIZE_BYTES / MB) / (time.perf_counter() - started)


def _rotated(routes: Sequence[str], index: int) -> list[str]:
    shift = index % len(routes)
    return [*routes[shift:], *routes[:shift]]


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(8, 3)
    rates: dict[str, list[float]] = {}
    cpu: list[float] = []
    async with bench_cluster(ctx) as cluster:
        if cluster is None:
            return []
        with ByteServer(ctx.work_dir / "run.sock") as server:
            async with BridgePod(cluster.api, cluster.namespace, CHANNEL_DIR) as pod:
                await _measure(pod, server.path, rounds, rates, cpu)
    namespace = cluster.namespace
    ctx.note(
        f"{rounds} rounds after {WARMUP_ROUNDS} warm-up, {SIZE_BYTES // MB} MB a transfer (MB = 2^20), every route "
        f"once a round, the order rotated; one pod of the subagent image (runc), this tree's container/ code in it; "
        f"namespace {namespace} (deleted); the host's end of the bridge and the byte server in this process"
    )
    return _rows(rates, cpu)


async def _measure(
    pod: BridgePod, server_path: Path, rounds: int, rates: dict[str, list[float]], cpu: list[float]
) -> None:
    bridge = PodBridge("bench-bridge", lambda: pod.exec([PYTHON, "-c", BRIDGE]), {BRIDGE_TARGET_RUN: server_path})
    running = asyncio.create_task(bridge.run())
    streams: list[ExecStream] = []
    host = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, str(server_path), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            await bridge.wait_for(lambda b: b.sessions >= 1)
        in_pod = await pod.exec([PYTHON, "-c", CLIENT, f"{CHANNEL_DIR}/{CHANNEL_SOCKET_FILE}"])
        echo = await pod.exec([PYTHON, "-c", EXEC_ECHO])
        streams += [in_pod, echo]
        clients = {"bridge": _Lines(exec_stream=in_pod), "plain": _Lines(process=host)}
        routes = [f"{kind}-{direction}" for kind in ("bridge", "plain", "exec") for direction in DIRECTIONS]
        for index in range(WARMUP_ROUNDS + rounds):
            for route in _rotated(routes, index):
                kind, direction = route.split("-")
                spent = time.process_time()
                if kind == "exec":
                    rate = await _exec_rate(echo, direction)
                else:
                    rate = await _client_rate(clients[kind], direction)
                spent = time.process_time() - spent
                if index >= WARMUP_ROUNDS:
                    rates.setdefault(route, []).append(rate)
                    if kind == "bridge":
                        cpu.append(ms(spent))
    finally:
        for stream in streams:
            await stream.close()
        if host.stdin is not None:
            host.stdin.close()
        await host.wait()
        await bridge.close()
        await running


def _rows(rates: dict[str, list[float]], cpu: list[float]) -> list[Row]:
    rows: list[Row] = []
    for direction in DIRECTIONS:
        what = "host → pod" if direction == "down" else "pod → host"
        plain = Measure.rates(rates[f"plain-{direction}"])
        bridge = Measure.rates(rates[f"bridge-{direction}"])
        bare = Measure.rates(rates[f"exec-{direction}"])
        goal = " (goal ≥ 0.8×)"
        rows += [
            Row(NAME, f"{SIZE_BYTES // MB} MB {what} through the bridge{goal}", "MB/s", bridge, PLAIN, plain),
            Row(
                NAME, f"{SIZE_BYTES // MB} MB {what} through a bare exec stream (no bridge)", "MB/s", bare, PLAIN, plain
            ),
            Row(
                NAME,
                f"{SIZE_BYTES // MB} MB {what}: the bridge",
                "MB/s",
                bridge,
                "a bare exec stream, same round",
                bare,
            ),
        ]
    rows.append(
        Row(
            NAME,
            f"this process's CPU per {SIZE_BYTES // MB} MB through the bridge (its host end)",
            "ms",
            Measure.of(cpu),
        )
    )
    return rows
