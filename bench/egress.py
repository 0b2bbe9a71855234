"""The door to the web: a 50 MB download through it against the same download straight, and one small request's
added latency.

In one process, no Docker: the run's door (`runner.egress.door.EgressDoor` on a Unix socket, on this worker's
asyncio loop as the bot runs it) and the container's forwarder (`container.forwarder.Forwarder`, a loopback TCP
port relaying each connection to the door), in-process on the same loop, as tests/container/test_forwarder.py
drives it. So this loop carries both hops; in a run the forwarder is the container's own process. The web server
(`python -m http.server` on 127.0.0.1) and the client (curl, a new connection per transfer, timed by curl's own
`time_total`) are processes of their own. The door allowlists `127.0.0.1:<port>`, an IP literal: its DNS threads
are not used (a name would add one getaddrinfo in them per connection).

- throughput: 50 MB (random bytes, MB = 2^20 as the bot shows sizes) downloaded straight (curl → http.server),
  through forwarder → door as a plain proxy request (`curl --proxy`), the same inside a CONNECT tunnel
  (`--proxytunnel`), with the forwarder in a Python process of its own (the door alone on this loop), and
  through two bare relays in threads (TCP → Unix → TCP, blocking 1 MiB copies: what any relay on the door's byte
  path costs here). Per round each once, the order rotated, each between two straight downloads (straight,
  door, straight, tunnel, straight, …, straight): its ratio is its MB/s over the geometric mean of the straight
  ones either side, so a swing in the shared machine's load hits both sides of a ratio; the median of those
  ratios, their quartiles and range. Also the MB/s medians, this process's CPU time (`time.process_time`) per
  download (door + forwarder, and the door alone) and curl's own (its rusage).
- latency: a GET of 5 bytes, a new connection each, straight, through forwarder → door, and in a tunnel; per
  round each once, the order rotated; curl's `time_total`, and through − straight per round.
The issue's goals: through the door ≥ 0.8× straight; ≤ 5 ms added (p50).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import resource
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import BenchContext, ms
from bench.egress_rig import LOOPBACK, BareRelays, ForwarderProcess, WebServer, curl
from bench.report import Measure, Row
from container.forwarder import Forwarder
from core.egress_rules import EgressMode, parse_entry
from core.setting_bounds import MAX_SUBAGENT_EGRESS_MB
from runner.egress.door import EgressDoor
from runner.egress.records import EgressEvent, EgressRules
from runner.egress.resolve import own_addresses

NAME = "egress"
MB = 1024 * 1024
SIZE_BYTES = 50 * MB
BIG_FILE = "big.bin"
SMALL_FILE = "small.txt"
SMALL_BODY = b"hello"
WARMUP_ROUNDS = 1
MAX_CONNECTIONS = 16  # SUBAGENT_EGRESS_MAX_CONNECTIONS' default
STRAIGHT_LABEL = "the same download straight (curl → http.server), same rounds"
SMALL_LABEL = "the same GET straight (curl → http.server), same round"


@dataclass(frozen=True, slots=True)
class _Route:
    key: str
    origin: str  # http://host:port curl asks for
    proxy: str | None = None
    tunnel: bool = False


@dataclass(slots=True)
class _Rig:
    straight: _Route
    door: _Route  # forwarder (in this loop) → door
    tunnel: _Route  # the same, CONNECT
    door_alone: _Route  # forwarder in a process of its own → door
    relays: _Route

    def compared_routes(self) -> list[_Route]:
        return [self.door, self.tunnel, self.door_alone, self.relays]

    def latency_routes(self) -> list[_Route]:
        return [self.straight, self.door, self.tunnel]


def _rotated(routes: Sequence[_Route], index: int) -> list[_Route]:
    shift = index % len(routes)
    return [*routes[shift:], *routes[:shift]]


@dataclass(frozen=True, slots=True)
class _Download:
    rate: float  # MB/s
    cpu_ms: float  # this process's
    curl_cpu_ms: float


@dataclass(slots=True)
class _Throughput:
    rates: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    curl_cpu: dict[str, list[float]] = field(default_factory=dict)
    against_straight: dict[str, list[float]] = field(default_factory=dict)  # over the straight ones either side

    def add(self, key: str, download: _Download) -> None:
        self.rates.setdefault(key, []).append(download.rate)
        self.cpu.setdefault(key, []).append(download.cpu_ms)
        self.curl_cpu.setdefault(key, []).append(download.curl_cpu_ms)


def _children_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # curl's, once reaped; the long-lived children are not
    return used.ru_utime + used.ru_stime


async def _round(rig: _Rig, index: int, work_dir: Path, digest: str | None, into: _Throughput | None) -> None:
    """Straight, then each compared route (the order rotated) followed by a straight one: every compared download
    sits between two straight ones, and its ratio is taken against their geometric mean."""
    before = await _download(rig.straight, work_dir, digest)
    if into is not None:
        into.add(rig.straight.key, before)
    for route in _rotated(rig.compared_routes(), index):
        through = await _download(route, work_dir, digest)
        after = await _download(rig.straight, work_dir, digest)
        if into is not None:
            into.add(route.key, through)
            into.add(rig.straight.key, after)
            ratio = through.rate / math.sqrt(before.rate * after.rate)
            into.against_straight.setdefault(route.key, []).append(ratio)
        before = after


async def _download(route: _Route, work_dir: Path, digest: str | None) -> _Download:
    """One 50 MB download by `route`. With `digest`, the bytes are kept and checked."""
    output = work_dir / f"got-{route.key}.bin" if digest is not None else None
    cpu = time.process_time()
    children = _children_cpu_seconds()
    got = await curl(f"{route.origin}/{BIG_FILE}", proxy=route.proxy, tunnel=route.tunnel, output=output)
    cpu = time.process_time() - cpu
    children = _children_cpu_seconds() - children
    if (got.status, got.size) != (200, SIZE_BYTES):
        raise RuntimeError(f"{route.key}: HTTP {got.status}, {got.size} bytes, not 200 and {SIZE_BYTES}")
    if output is not None:
        data = await asyncio.to_thread(output.read_bytes)
        output.unlink()
        if hashlib.sha256(data).hexdigest() != digest:
            raise RuntimeError(f"{route.key}: the downloaded bytes differ from the served ones")
    return _Download((SIZE_BYTES / MB) / got.seconds, ms(cpu), ms(children))


async def _small(route: _Route) -> float:
    got = await curl(f"{route.origin}/{SMALL_FILE}", proxy=route.proxy, tunnel=route.tunnel)
    if (got.status, got.size) != (200, len(SMALL_BODY)):
        raise RuntimeError(f"{route.key}: HTTP {got.status}, {got.size} bytes for the small GET")
    return ms(got.seconds)


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(20, 5)
    pairs = ctx.scaled(100, 30)
    www = ctx.work_dir / "www"
    www.mkdir()
    payload = os.urandom(SIZE_BYTES)
    digest = hashlib.sha256(payload).hexdigest()
    await asyncio.to_thread((www / BIG_FILE).write_bytes, payload)
    del payload
    (www / SMALL_FILE).write_bytes(SMALL_BODY)
    door_path = ctx.work_dir / "egress.sock"
    events: list[EgressEvent] = []
    throughput = _Throughput()
    small: dict[str, list[float]] = {}
    async with WebServer(www) as server:
        target = f"{LOOPBACK}:{server.port}"
        rules = EgressRules(
            mode=EgressMode.ALLOWLIST,
            allow=(parse_entry(target),),
            max_bytes=MAX_SUBAGENT_EGRESS_MB * MB,
            max_connections=MAX_CONNECTIONS,
        )
        own = await asyncio.to_thread(own_addresses)  # as runner/lifecycle/run_doors.py gives every door
        door = EgressDoor(door_path, rules, on_event=events.append, own_addresses=own)
        await door.start()
        try:
            async with Forwarder(door_path) as forwarder, ForwarderProcess(door_path) as alone:
                with BareRelays(ctx.work_dir, server.port) as relays:
                    origin = f"http://{target}"
                    rig = _Rig(
                        straight=_Route("straight", origin),
                        door=_Route("door", origin, forwarder.url),
                        tunnel=_Route("tunnel", origin, forwarder.url, tunnel=True),
                        door_alone=_Route("door_alone", origin, alone.url),
                        relays=_Route("relays", f"http://{LOOPBACK}:{relays.port}"),
                    )
                    for index in range(WARMUP_ROUNDS + rounds):
                        warm = index < WARMUP_ROUNDS
                        await _round(rig, index, ctx.work_dir, digest if warm else None, None if warm else throughput)
                    for index in range(WARMUP_ROUNDS + pairs):
                        for route in _rotated(rig.latency_routes(), index):
                            took = await _small(route)
                            if index >= WARMUP_ROUNDS:
                                small.setdefault(route.key, []).append(took)
        finally:
            await door.close()
    _check_events(events, (WARMUP_ROUNDS + rounds) * 3 + (WARMUP_ROUNDS + pairs) * 2)
    await _notes(ctx, rounds, pairs, events, throughput)
    return _rows(throughput, small)


def _check_events(events: list[EgressEvent], expected: int) -> None:
    """Every connection through the door allowed and carried to its end, none cut."""
    wrong = [event for event in events if not event.allowed or event.reason]
    if wrong or len(events) != expected:
        raise RuntimeError(f"{len(events)} door events (expected {expected}); not clean: {wrong[:3]}")


async def _notes(
    ctx: BenchContext, rounds: int, pairs: int, events: list[EgressEvent], throughput: _Throughput
) -> None:
    version = await _curl_version()
    ctx.note(
        f"{rounds} throughput rounds and {pairs} latency rounds, each after {WARMUP_ROUNDS} warm-up (its downloads "
        f"kept and their sha256 checked against the served bytes); every route once a round, the order rotated, a "
        f"throughput route between two straight downloads; client {version}; server: python -m http.server (a "
        f"thread per connection, Connection: close)"
    )
    ctx.note(
        "the door and the forwarder in this process, on one asyncio loop (the forwarder in-process as its tests run "
        "it; in a run it is the container's own process, sharing SUBAGENT_CPUS with the client); curl and the server "
        "are processes of their own, all on this machine's cores"
    )
    down = sum(event.bytes_down for event in events)
    ctx.note(
        f"{len(events)} connections through the door, all allowed and carried to their end, {down / MB:,.0f} MB "
        f"down; the door's budget was set to SUBAGENT_EGRESS_MAX_MB's ceiling ({MAX_SUBAGENT_EGRESS_MB:,}): at its "
        f"default of 50 a run could not fetch this file (the response head and the request count too)"
    )
    ctx.note(
        f"this process's CPU during a straight download (curl's process management only): "
        f"{Measure.of(throughput.cpu['straight']).median:.1f} ms"
    )
    ctx.note(f"load average at the end: {', '.join(f'{load:.2f}' for load in os.getloadavg())}")


def _spread(ratios: list[float]) -> str:
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.2f}× (quartiles {low:.2f}–{high:.2f}; {min(ratios):.2f}–{max(ratios):.2f})"


async def _curl_version() -> str:
    binary = shutil.which("curl") or "curl"
    process = await asyncio.create_subprocess_exec(binary, "--version", stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    return " ".join(out.decode().split()[:2])


def _rows(throughput: _Throughput, small: dict[str, list[float]]) -> list[Row]:
    rates, cpu, ratios = throughput.rates, throughput.cpu, throughput.against_straight
    straight_rate = Measure.rates(rates["straight"])
    straight_small = Measure.of(small["straight"])
    added = [through - straight for through, straight in zip(small["door"], small["straight"], strict=True)]
    added_tunnel = [through - straight for through, straight in zip(small["tunnel"], small["straight"], strict=True)]
    prefix = "50 MB download (curl, a new connection)"
    routes = {
        "door": "through forwarder → door, a plain proxy request",
        "tunnel": "through forwarder → door, in a CONNECT tunnel",
        "door_alone": "through the door, the forwarder in a process of its own (the door alone on this loop)",
        "relays": "through two bare relays (TCP → Unix → TCP, threads, blocking 1 MiB copies; no door)",
    }
    against = "÷ the straight downloads either side (their geometric mean), median of the rounds"
    return [
        *(
            Row(
                NAME,
                f"{prefix} {label} {against}" + (" (goal ≥ 0.8×)" if key == "door" else ""),
                "×",
                Measure.rates(ratios[key]),
                text=_spread(ratios[key]),
            )
            for key, label in routes.items()
        ),
        *(
            Row(NAME, f"{prefix} {label}", "MB/s", Measure.rates(rates[key]), STRAIGHT_LABEL, straight_rate)
            for key, label in routes.items()
        ),
        Row(
            NAME,
            "the same through forwarder → door (plain)",
            "MB/s",
            Measure.rates(rates["door"]),
            "two bare relays, same rounds",
            Measure.rates(rates["relays"]),
        ),
        Row(NAME, "this process's CPU per 50 MB: door + forwarder (plain)", "ms", Measure.of(cpu["door"])),
        Row(NAME, "this process's CPU per 50 MB: the door alone", "ms", Measure.of(cpu["door_alone"])),
        Row(
            NAME,
            "curl's CPU per 50 MB through forwarder → door (plain; its start and exit included)",
            "ms",
            Measure.of(throughput.curl_cpu["door"]),
            "curl's, straight",
            Measure.of(throughput.curl_cpu["straight"]),
        ),
        Row(
            NAME,
            "one GET of 5 bytes (curl, a new connection) through forwarder → door",
            "ms",
            Measure.of(small["door"]),
            SMALL_LABEL,
            straight_small,
        ),
        Row(
            NAME,
            "one GET of 5 bytes through forwarder → door, in a CONNECT tunnel",
            "ms",
            Measure.of(small["tunnel"]),
            SMALL_LABEL,
            straight_small,
        ),
        Row(
            NAME, "added by forwarder → door: through − straight, per round (goal ≤ 5 ms p50)", "ms", Measure.of(added)
        ),
        Row(NAME, "added by forwarder → door in a CONNECT tunnel, per round", "ms", Measure.of(added_tunnel)),
    ]
