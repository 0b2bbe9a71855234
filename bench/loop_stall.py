"""Event-loop stall: the longest gap a loop-lag probe sees while the host takes a flood.

A probe task sleeps PROBE_INTERVAL_SECONDS in a loop and records how late each wake-up is (its gap); a
window's figures are its longest gap and its p99 gap. The app is the real one (real PTB against the fake
Bot API in a process of its own, SQLite, outbox, task manager, LLM proxy and run channels, the IPC watcher
as runner/service.py builds it) on the in-memory container runtime (tests.fakes.memory_runtime), so no
engine work is in the figures. Everything that is not the host runs in processes of its own, started
before any window: the junk writer and the "container" (the real container.channel.RunChannel on the
run's socket), so the probe sees only the host's own work. Per round, in one worker process:

- probe alone: no app, nothing else on the loop (baseline of the baseline);
- app started, idle (baseline of the cases);
- (a) 10,000 junk .json files written into an allowed chat's tasks/ by the writer process as fast as it
  can; the window ends when all are quarantined (the writer polls tasks/ and errors/ from its side);
- (b) a spawn request whose container, as fast as it can, sends SUBAGENT_MAX_MESSAGES' default (10)
  progress messages of MAX_PROGRESS_CHARS each (all at once), hands back a valid pydantic-ai session of
  just under MAX_SESSION_BYTES and reports a result of MAX_RESULT_CHARS; the window ends once the run is
  settled and cleaned up and the chat's outbox has sent everything (progress and the result's parts);
- (b') the same with 1,000 progress messages (the setting's ceiling); that window ends when the run is
  cleaned up (the rate-limited outbox would take minutes), and its unsent progress rows are dropped after;
- a full collection, gc.collect() on the loop's thread: what an automatic one costs the loop when it comes.

Each round runs twice, in a fresh app each time: as the bot runs today, and with `gc.collect(); gc.freeze()`
once start-up is done (a mitigation to compare; the bot does not call it). Python's collections are timed
through `gc.callbacks`, so a gap can be told apart from a full (generation-2) collection that caused it.
Logging is at the production default (INFO, console format) into the worker's log file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BenchContext, bench_settings, ms, poll_until
from bench.report import Measure, Row
from bench.tg_process import TelegramProcess
from bot.channels.telegram import TelegramChannel
from container.protocol import (
    CHANNEL_DIR,
    CHANNEL_SOCKET_FILE,
    MAX_PROGRESS_CHARS,
    MAX_RESULT_CHARS,
    MAX_SESSION_BYTES,
    SpawnRequest,
)
from core.delivery import Delivery
from core.logging import configure_logging
from core.settings import Settings
from core.store.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from runner.ipc import ERRORS_DIR, TASKS_DIR, ensure_chat_dirs, write_spawn_request
from runner.runtime import LABEL_RUN_ID
from runner.service import SubagentService
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime

NAME = "stall"
PROBE_INTERVAL_SECONDS = 0.005
GOAL_MS = 50.0
JUNK_FILES = 10_000
DEFAULT_MAX_MESSAGES = 10  # SUBAGENT_MAX_MESSAGES' default
CEILING_MAX_MESSAGES = 1_000  # the most SUBAGENT_MAX_MESSAGES allows
SESSION_MARGIN_BYTES = 16 * 1024  # the session sent is this much under MAX_SESSION_BYTES, or less
POLL_TIMEOUT_SECONDS = 1  # the app's long poll, as in bench/apps.py: its shutdown stays quick
SETTLE_SECONDS = 1.0  # after the chats' folders appear: the watcher restarts and sweeps
TAIL_SECONDS = 0.3  # each window goes on this long after its work is done (deferred work shows up too)
WAIT_SECONDS = 180.0
WATCH_SECONDS = 0.02  # how often the host side looks at an in-memory state (no I/O) to end a window
OUTBOX_POLL_SECONDS = 0.05  # how often it asks the store whether the chat's outbox is empty

PEER_JUNK = "junk"
PEER_CONTAINER = "container"

MODE_TODAY = "today"
MODE_FROZEN = "frozen"
MODES = (MODE_TODAY, MODE_FROZEN)


# --- measuring ------------------------------------------------------------------------------------------


class LagProbe:
    """Sleeps `interval` in a loop; each wake-up's lateness is a gap, kept with when it woke."""

    def __init__(self, interval: float = PROBE_INTERVAL_SECONDS) -> None:
        self._interval = interval
        self.samples: list[tuple[float, float]] = []  # (woke at, gap): time.monotonic, the helpers' clock too
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        interval = self._interval
        while True:
            before = time.monotonic()
            await asyncio.sleep(interval)
            woke = time.monotonic()
            self.samples.append((woke, woke - before - interval))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass(frozen=True, slots=True)
class GcPause:
    start: float
    stop: float
    generation: int

    @property
    def seconds(self) -> float:
        return self.stop - self.start


class GcRecorder:
    """Times every collection through `gc.callbacks` (called in whichever thread triggered it)."""

    def __init__(self) -> None:
        self.pauses: list[GcPause] = []
        self._started: tuple[float, int] | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = (now, info["generation"])
        elif self._started is not None:
            self.pauses.append(GcPause(self._started[0], now, self._started[1]))
            self._started = None

    def __enter__(self) -> GcRecorder:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)

    def between(self, start: float, stop: float) -> list[GcPause]:
        return [p for p in self.pauses if p.stop > start and p.start < stop]


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


@dataclass(slots=True)
class Window:
    """One measured stretch: the probe's gaps and the collections within it."""

    name: str
    seconds: float
    gaps: list[tuple[float, float]]
    pauses: list[GcPause]
    facts: dict[str, float | int | str] = field(default_factory=dict)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (name, when it began), in order

    def longest_gap_phase(self) -> str:
        """The phase of the work in which the longest gap began: when that wake-up was due."""
        woke, gap = max(self.gaps, key=lambda sample: sample[1])
        due = woke - gap
        found = ""
        for name, began in self.phases:
            if due >= began:
                found = name
        return found

    @property
    def max_ms(self) -> float:
        return ms(max(gap for _, gap in self.gaps))

    @property
    def p99_ms(self) -> float:
        return ms(nearest_rank([gap for _, gap in self.gaps], 0.99))

    @property
    def longest_gc_ms(self) -> float:
        return ms(max((p.seconds for p in self.pauses), default=0.0))

    @property
    def longest_gen2_ms(self) -> float:
        return ms(max((p.seconds for p in self.pauses if p.generation == 2), default=0.0))

    @property
    def gen2_count(self) -> int:
        return sum(1 for p in self.pauses if p.generation == 2)

    def gc_in_longest_gap_ms(self) -> float:
        """How much of the longest gap was spent collecting (any generation, any thread)."""
        woke, gap = max(self.gaps, key=lambda sample: sample[1])
        start = woke - gap - PROBE_INTERVAL_SECONDS
        return ms(sum(max(0.0, min(p.stop, woke) - max(p.start, start)) for p in self.pauses))

    def summary(self) -> dict[str, float | int | str]:
        return {
            "seconds": round(self.seconds, 3),
            "max_ms": round(self.max_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "wakeups": len(self.gaps),
            "longest_gc_ms": round(self.longest_gc_ms, 3),
            "gen2_collections": self.gen2_count,
            "longest_gen2_ms": round(self.longest_gen2_ms, 3),
            "gc_in_longest_gap_ms": round(self.gc_in_longest_gap_ms(), 3),
            **self.facts,
        }


Work = Callable[[], Awaitable[tuple[dict[str, Any], list[tuple[str, float]]]]]


async def measured(name: str, recorder: GcRecorder, work: Work) -> Window:
    """Run `work` with the probe on, then TAIL_SECONDS more; `work` returns facts and its phases."""
    probe = LagProbe()
    probe.start()
    started = time.monotonic()
    try:
        facts, phases = await work()
        tail = time.monotonic()
        await asyncio.sleep(TAIL_SECONDS)
    finally:
        await probe.stop()
    ended = time.monotonic()
    if not probe.samples:
        raise RuntimeError(f"the probe never woke during {name}")
    phases = [("start", started), *phases, ("tail", tail)]
    return Window(name, ended - started, probe.samples, recorder.between(started, ended), facts, phases)


# --- the processes beside the host ----------------------------------------------------------------------


class Peer:
    """A helper process (`python -m bench.loop_stall ROLE`): one JSON line in, one JSON line out."""

    def __init__(self, role: str) -> None:
        self._role = role
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Peer:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.loop_stall",
            self._role,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        ready = await self._read(60.0)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the {self._role} process did not start: {ready}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()  # our own child
            await process.wait()

    async def _read(self, timeout_seconds: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout_seconds)
        if not line:
            raise RuntimeError(f"the {self._role} process ended (see the worker's log)")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def call(self, command: dict[str, Any], timeout_seconds: float = WAIT_SECONDS) -> dict[str, Any]:
        async with self._lock:
            assert self._process is not None and self._process.stdin is not None
            self._process.stdin.write(json.dumps(command).encode() + b"\n")
            await self._process.stdin.drain()
            answer = await self._read(timeout_seconds)
        if "error" in answer:
            raise RuntimeError(f"the {self._role} process failed: {answer['error']}")
        return answer


def _junk_body(i: int, rng: random.Random, name: str, other_chat_id: int) -> bytes:
    """Four kinds, all named *.json so each is read and quarantined at once (no wait for staleness)."""
    kind = i % 4
    if kind == 0:  # not text at all
        return rng.randbytes(rng.randint(16, 512))
    if kind == 1:  # JSON, but not a spawn request
        return json.dumps({"version": 1, "task": i, "surprise": [True] * rng.randint(1, 20)}).encode()
    request_id = f"junk-req-{i:06d}"
    if kind == 2:  # a valid request under another file name
        return SpawnRequest(request_id=request_id, task="rm -rf / # please").model_dump_json().encode()
    # a valid request for another chat
    assert name == f"{request_id}.json"
    return SpawnRequest(request_id=request_id, task="hello", chat_id=other_chat_id).model_dump_json().encode()


def _errors_count(errors: Path) -> int:
    try:
        return len(os.listdir(errors))
    except FileNotFoundError:
        return 0


def _flood(command: dict[str, Any]) -> dict[str, Any]:
    """Write the junk as fast as possible, then wait until tasks/ is empty and errors/ holds all of it."""
    tasks, errors = Path(command["tasks"]), Path(command["errors"])
    count, other_chat_id = int(command["count"]), int(command["other_chat_id"])
    rng = random.Random(int(command["seed"]))
    before = _errors_count(errors)
    names = [f"junk-req-{i:06d}.json" if i % 4 == 3 else f"junk-{i:06d}.json" for i in range(count)]
    bodies = [_junk_body(i, rng, name, other_chat_id) for i, name in enumerate(names)]
    first = time.monotonic()
    for name, body in zip(names, bodies, strict=True):
        fd = os.open(tasks / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
    last = time.monotonic()
    deadline = last + float(command["timeout"])
    while True:
        with os.scandir(tasks) as entries:
            empty = next(entries, None) is None
        # Each quarantined file leaves two entries: the file and its .reason.txt.
        if empty and _errors_count(errors) - before >= 2 * count:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    done = time.monotonic()
    left = sum(1 for _ in os.scandir(tasks))
    return {
        "first": first,
        "last": last,
        "done": done,
        "left_in_tasks": left,
        "quarantined": (_errors_count(errors) - before) // 2,
    }


def _junk_main() -> int:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            answer = _flood(json.loads(line))
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


def _prose(chars: int, seed: int) -> str:
    """Markdown-ish text of exactly `chars` characters, as an agent writes it (bold, code, lists)."""
    words = ["build", "**passed**", "`make test`", "the", "module", "report", "- item", "error", "fixed", "and"]
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
        parts.append(line)
        size += len(line)
    return "".join(parts)[:chars]


def _session_bytes(limit: int) -> bytes:
    """A valid pydantic-ai history of tool calls and their output, just under `limit` bytes as JSON."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    def step(i: int) -> list[ModelMessage]:
        call_id = f"call_{i:06d}"
        output = "".join(f"line {j} of step {i}: compiling module_{j}.py ... ok\n" for j in range(30))
        return [
            ModelResponse(
                parts=[
                    TextPart(content=f"Step {i}: running the next command and reading its output. " * 4),
                    ToolCallPart(tool_name="bash", args={"command": f"make -C build target_{i}"}, tool_call_id=call_id),
                ],
                model_name="offline-subagent",
            ),
            ModelRequest(parts=[ToolReturnPart(tool_name="bash", content=output, tool_call_id=call_id)]),
        ]

    per_step = len(ModelMessagesTypeAdapter.dump_json(step(0)))
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content="Build everything and report.")])]
    for i in range(limit // per_step + 1):
        if i and i % 40 == 0:
            messages.append(ModelRequest(parts=[UserPromptPart(content=f"Keep going ({i} steps so far).")]))
        messages += step(i)
    data = ModelMessagesTypeAdapter.dump_json(messages)
    while len(data) > limit:
        messages = messages[:-2]
        data = ModelMessagesTypeAdapter.dump_json(messages)
    return data


async def _act(command: dict[str, Any], session: bytes, progress: str, result: str) -> dict[str, Any]:
    """One run's container: task, every progress message at once, the session, the result."""
    from container.channel import ChannelRefused, RunChannel
    from container.protocol import ProgressMessage, RunResult

    count = int(command["messages"])
    started = time.monotonic()
    async with RunChannel(Path(command["socket"])) as channel:
        await channel.task()
        answers = await asyncio.gather(
            *(channel.send_message(ProgressMessage(message_id=f"p{i:07d}", text=progress)) for i in range(count)),
            return_exceptions=True,
        )
        messages_done = time.monotonic()
        await channel.save_session(session)
        session_done = time.monotonic()
        await channel.report(RunResult(status="completed", result=result))
    refused = [a for a in answers if isinstance(a, ChannelRefused)]
    failed = [a for a in answers if isinstance(a, BaseException) and not isinstance(a, ChannelRefused)]
    if failed:
        raise RuntimeError(f"{len(failed)} progress message(s) failed: {failed[0]!r}")
    return {
        "accepted": count - len(refused),
        "refused": len(refused),
        "started": started,
        "messages_done": messages_done,
        "session_done": session_done,
        "reported": time.monotonic(),
        "session_bytes": len(session),
    }


async def _container_loop() -> None:
    session = _session_bytes(MAX_SESSION_BYTES - SESSION_MARGIN_BYTES)
    progress = _prose(MAX_PROGRESS_CHARS, 1)
    result = _prose(MAX_RESULT_CHARS, 2)
    print(json.dumps({"ready": True, "session_bytes": len(session)}), flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        try:
            answer = await _act(json.loads(line), session, progress, result)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


def _peer_main(argv: list[str]) -> int:
    if argv == [PEER_JUNK]:
        return _junk_main()
    if argv == [PEER_CONTAINER]:
        asyncio.run(_container_loop())
        return 0
    print(f"usage: python -m bench.loop_stall {PEER_JUNK}|{PEER_CONTAINER}", file=sys.stderr)
    return 2


# --- the host -------------------------------------------------------------------------------------------


def _socket_of(container: MemoryContainer) -> Path:
    assert container.spec is not None
    mount = next(m for m in container.spec.mounts if m.target == CHANNEL_DIR)
    return mount.source / CHANNEL_SOCKET_FILE


class Containers:
    """The in-memory runtime's behaviour: each started container is one job for the container process."""

    def __init__(self, peer: Peer) -> None:
        self._peer = peer
        self.messages: dict[str, int] = {}  # run id -> progress messages its container sends
        self.done: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def expect(self, run_id: str, messages: int) -> asyncio.Future[dict[str, Any]]:
        self.messages[run_id] = messages
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.done[run_id] = future
        return future

    async def behave(self, container: MemoryContainer) -> int | None:
        run_id = container.labels[LABEL_RUN_ID]
        try:
            answer = await self._peer.call(
                {"socket": str(_socket_of(container)), "messages": self.messages[run_id]}, WAIT_SECONDS
            )
        except BaseException as exc:
            if not self.done[run_id].done():
                self.done[run_id].set_exception(exc)
            raise
        self.done[run_id].set_result(answer)
        return 0


@dataclass(slots=True)
class Chats:
    junk: int
    subagent: int
    ceiling: int
    folders: dict[int, str] = field(default_factory=dict)


@asynccontextmanager
async def stall_app(settings: Settings, runtime: MemoryRuntime) -> AsyncIterator[tuple[App, SubagentService]]:
    """The app as bench/apps.py builds it, on the in-memory runtime."""
    stores = await Stores.open(settings)
    assert settings.telegram_bot_token is not None
    channel = TelegramChannel(
        settings.telegram_bot_token.get_secret_value(),
        settings.telegram_api_base_url,
        poll_timeout_seconds=POLL_TIMEOUT_SECONDS,
    )
    built: list[SubagentService] = []

    def factory(delivery: Delivery, typing: TypingIndicator) -> SubagentService:
        service = SubagentService(settings, stores, delivery, typing, runtime)
        built.append(service)
        return service

    app = App(settings, channel, stores, factory)
    try:
        await app.start()
    except BaseException:
        await app.stop()
        raise
    try:
        yield app, built[0]
    finally:
        await app.stop()
        await runtime.stop_behaviours()


async def _idle(seconds: float) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    await asyncio.sleep(seconds)
    return {}, []


async def _full_collection() -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """What an automatic full collection does to the loop when it comes: the same work, on the loop's thread."""
    await asyncio.sleep(0.1)  # the probe is running
    started = time.monotonic()
    gc.collect()
    return {"collect_ms": round(ms(time.monotonic() - started), 3)}, [("gc.collect()", started)]


async def _junk_work(
    peer: Peer, service: SubagentService, chats: Chats, seed: int
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    ipc_root = service.paths.ipc_root
    asked = time.monotonic()
    answer = await peer.call(
        {
            "tasks": str(ipc_root / chats.folders[chats.junk] / TASKS_DIR),
            "errors": str(ipc_root / ERRORS_DIR),
            "count": JUNK_FILES,
            "other_chat_id": chats.subagent,
            "seed": seed,
            "timeout": WAIT_SECONDS,
        }
    )
    if answer["left_in_tasks"] or answer["quarantined"] != JUNK_FILES:
        raise RuntimeError(f"not every junk file was quarantined: {answer}")
    facts = {
        "files": JUNK_FILES,
        "asked_to_first_write_s": round(answer["first"] - asked, 4),
        "write_s": round(answer["last"] - answer["first"], 4),
        "quarantined_s": round(answer["done"] - answer["first"], 4),
    }
    return facts, [("writing", answer["first"]), ("quarantining the rest", answer["last"])]


async def _subagent_work(
    app: App, service: SubagentService, containers: Containers, chat_id: int, folder: str, messages: int, drain: bool
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    run_id = f"stall-{secrets.token_hex(6)}"
    finished = containers.expect(run_id, messages)
    asked = time.monotonic()
    request = SpawnRequest(request_id=run_id, task="Build everything and report.", label="stall")
    await asyncio.to_thread(write_spawn_request, service.paths.ipc_root, folder, request)
    answer = await asyncio.wait_for(finished, WAIT_SECONDS)

    async def cleaned_up() -> bool | None:
        return True if run_id not in service.live else None

    async def outbox_empty() -> bool | None:
        return True if not await app.stores.outbox.pending(chat_id) else None

    await poll_until(cleaned_up, WAIT_SECONDS, "the run to be cleaned up", WATCH_SECONDS)
    cleaned = time.monotonic()
    if drain:
        await poll_until(outbox_empty, WAIT_SECONDS, "the chat's outbox to be sent", OUTBOX_POLL_SECONDS)
    record = await service.runs.get(run_id)
    if record is None or record.status != "completed":
        raise RuntimeError(f"run {run_id} ended {record.status if record else 'without a record'}")
    if answer["accepted"] != messages:
        raise RuntimeError(f"{answer['accepted']} of {messages} progress messages were accepted")
    phases = [
        ("spawn request → container", asked),
        ("progress messages", answer["started"]),
        ("session upload", answer["messages_done"]),
        ("result", answer["session_done"]),
        ("run settled and cleaned up", answer["reported"]),
        ("delivery" if drain else "after", cleaned),
    ]
    facts = {
        "run_id": run_id,
        "messages": messages,
        "session_bytes": answer["session_bytes"],
        "spawn_to_container_start_s": round(answer["started"] - asked, 4),
        "messages_s": round(answer["messages_done"] - answer["started"], 4),
        "session_s": round(answer["session_done"] - answer["messages_done"], 4),
        "result_s": round(answer["reported"] - answer["session_done"], 4),
        "reported_to_cleaned_up_s": round(cleaned - answer["reported"], 4),
        "spawn_to_sent_s": round(time.monotonic() - asked, 4) if drain else "not waited for",
    }
    return facts, phases


@dataclass(slots=True)
class Pass:
    mode: str
    windows: dict[str, Window] = field(default_factory=dict)
    heap_objects: int = 0
    automatic_gen2: list[GcPause] = field(default_factory=list)  # after start-up, the forced one left out


async def _pass(
    ctx: BenchContext,
    tg: TelegramProcess,
    peers: tuple[Peer, Peer],
    recorder: GcRecorder,
    mode: str,
    index: int,
    idle_seconds: float,
) -> Pass:
    junk_peer, container_peer = peers
    result = Pass(mode)
    chats = Chats(ctx.chat_id(3 * index), ctx.chat_id(3 * index + 1), ctx.chat_id(3 * index + 2))
    chat_ids = [chats.junk, chats.subagent, chats.ceiling]

    result.windows["alone"] = await measured("alone", recorder, lambda: _idle(idle_seconds))

    settings = bench_settings(
        ctx.work_dir / f"data-{index}",
        token=tg.token,
        base_url=tg.base_url,
        LOG_LEVEL="INFO",
        ALLOWED_CHAT_IDS=",".join(str(c) for c in chat_ids),
        SUBAGENT_MAX_MESSAGES=CEILING_MAX_MESSAGES,  # the budget; each case sends its own count
    )
    await tg.add_chats(chat_ids)
    containers = Containers(container_peer)
    runtime = MemoryRuntime(on_start=containers.behave)
    async with stall_app(settings, runtime) as (app, service):
        for chat_id in chat_ids:
            chat = await app.stores.chats.ensure(chat_id, "supergroup", f"bench stall {chat_id}")
            chats.folders[chat_id] = chat.folder
            await asyncio.to_thread(ensure_chat_dirs, service.paths.ipc_root, chat.folder)
        await asyncio.sleep(SETTLE_SECONDS)
        result.heap_objects = len(gc.get_objects())
        if mode == MODE_FROZEN:
            gc.collect()
            gc.freeze()
        measuring = time.monotonic()
        try:
            result.windows["idle"] = await measured("idle", recorder, lambda: _idle(idle_seconds))
            result.windows["junk"] = await measured(
                "junk", recorder, lambda: _junk_work(junk_peer, service, chats, index)
            )
            result.windows["subagent"] = await measured(
                "subagent",
                recorder,
                lambda: _subagent_work(
                    app, service, containers, chats.subagent, chats.folders[chats.subagent], DEFAULT_MAX_MESSAGES, True
                ),
            )
            ceiling = await measured(
                "ceiling",
                recorder,
                lambda: _subagent_work(
                    app, service, containers, chats.ceiling, chats.folders[chats.ceiling], CEILING_MAX_MESSAGES, False
                ),
            )
            result.windows["ceiling"] = ceiling
            await app.delivery.drop_run_messages(str(ceiling.facts["run_id"]), "benchmark over")
            result.windows["collect"] = await measured("collect", recorder, _full_collection)
            measured_until = time.monotonic()
        finally:
            if mode == MODE_FROZEN:
                gc.unfreeze()
    forced = result.windows["collect"]
    result.automatic_gen2 = [
        pause
        for pause in recorder.between(measuring, measured_until)
        if pause.generation == 2 and pause not in forced.pauses
    ]
    return result


# --- rows -----------------------------------------------------------------------------------------------

Figure = Callable[[Pass], float]


def gap_max(window: str) -> Figure:
    return lambda p: p.windows[window].max_ms


def gap_p99(window: str) -> Figure:
    return lambda p: p.windows[window].p99_ms


def fact(window: str, key: str) -> Figure:
    return lambda p: float(p.windows[window].facts[key])


def _row(
    metric: str,
    passes: list[Pass],
    result: tuple[str, Figure],
    baseline_label: str,
    baseline: tuple[str, Figure],
    unit: str = "ms",
) -> Row:
    values = [result[1](p) for p in passes if p.mode == result[0]]
    base = [baseline[1](p) for p in passes if p.mode == baseline[0]]
    return Row(
        bench=NAME,
        metric=metric,
        unit=unit,
        result=Measure.of(values),
        baseline_label=baseline_label,
        baseline=Measure.of(base),
        extra={"worst": round(max(values), 3), "baseline_worst": round(max(base), 3)},
    )


def _rows(passes: list[Pass]) -> list[Row]:
    today, frozen = MODE_TODAY, MODE_FROZEN
    junk = f"(a) {JUNK_FILES:,} junk files written into an allowed chat's tasks/"
    subagent = (
        f"(b) a subagent: {DEFAULT_MAX_MESSAGES} progress messages of {MAX_PROGRESS_CHARS:,} chars at once, "
        f"a session just under {MAX_SESSION_BYTES // (1024 * 1024)} MiB, a {MAX_RESULT_CHARS:,}-char result"
    )
    ceiling = f"(b) the same with {CEILING_MAX_MESSAGES:,} progress messages (SUBAGENT_MAX_MESSAGES' ceiling)"
    idle = (today, gap_max("idle"))
    rows = [
        _row("app started, idle: longest loop gap", passes, idle, "the probe alone, no app", (today, gap_max("alone"))),
        _row(f"{junk}: longest loop gap", passes, (today, gap_max("junk")), "app idle", idle),
        _row(f"{junk}: p99 loop gap", passes, (today, gap_p99("junk")), "app idle", (today, gap_p99("idle"))),
        _row(
            f"{junk}: first write → all quarantined",
            passes,
            (today, fact("junk", "quarantined_s")),
            "the writer alone: first → last write",
            (today, fact("junk", "write_s")),
            unit="s",
        ),
        _row(f"{subagent}: longest loop gap", passes, (today, gap_max("subagent")), "app idle", idle),
        _row(f"{ceiling}: longest loop gap", passes, (today, gap_max("ceiling")), "app idle", idle),
    ]
    as_today = "as today (no gc.freeze)"
    cases = (("idle", "app idle"), ("junk", "(a)"), ("subagent", "(b)"), ("ceiling", "(b) 1,000 messages"))
    for key, what in cases:
        rows.append(
            _row(
                f"{what}, gc.freeze() after start-up: longest loop gap",
                passes,
                (frozen, gap_max(key)),
                as_today,
                (today, gap_max(key)),
            )
        )
    collect = "a full collection, gc.collect(), on the loop (what an automatic one costs when it comes)"
    rows.append(_row(f"{collect}: longest loop gap", passes, (today, gap_max("collect")), "app idle", idle))
    rows.append(
        _row(
            "the same full collection, gc.freeze() after start-up: longest loop gap",
            passes,
            (frozen, gap_max("collect")),
            as_today,
            (today, gap_max("collect")),
        )
    )
    return rows


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _notes(ctx: BenchContext, passes: list[Pass], rounds: int, idle_seconds: float) -> None:
    ctx.note(
        f"{rounds} round(s), each as today and with gc.collect() + gc.freeze() after start-up (a fresh app each); "
        f"probe every {PROBE_INTERVAL_SECONDS * 1000:g} ms; idle windows {idle_seconds:g} s; every window ends "
        f"{TAIL_SECONDS:g} s after its work; median of the rounds' figures, p95 column = the worst round"
    )
    for p in passes:
        parts = []
        for name, w in p.windows.items():
            gc_part = f", gen-2 {w.gen2_count}x up to {w.longest_gen2_ms:.0f} ms" if w.gen2_count else ""
            parts.append(f"{name} {w.max_ms:.1f} ms ({w.longest_gap_phase()}) in {w.seconds:.1f} s{gc_part}")
        automatic = p.automatic_gen2
        longest = max((ms(pause.seconds) for pause in automatic), default=0.0)
        ctx.note(
            f"{p.mode} ({p.heap_objects:,} objects tracked after start-up; {len(automatic)} automatic full "
            f"collection(s) after it, longest {longest:.0f} ms): " + "; ".join(parts)
        )
    for mode in MODES:
        worst = max(
            w.max_ms for p in passes if p.mode == mode for k, w in p.windows.items() if k not in ("alone", "collect")
        )
        verdict = "met" if worst <= GOAL_MS else "NOT met"
        ctx.note(
            f"goal <= {GOAL_MS:g} ms {verdict} ({mode}) in the measured cases: the worst window's longest gap was "
            f"{worst:.1f} ms (the forced full collection is not a case: it shows what one costs when it comes)"
        )
    for p in passes:
        for name, w in p.windows.items():
            if w.max_ms > GOAL_MS:
                ctx.note(
                    f"{p.mode} {name}: longest gap {w.max_ms:.0f} ms ({w.longest_gap_phase()}), a collection ran "
                    f"{w.gc_in_longest_gap_ms():.0f} ms of it"
                )
    junk = [p.windows["junk"].facts for p in passes]
    sub = [p.windows["subagent"].facts for p in passes]
    ceiling = [p.windows["ceiling"].facts for p in passes]
    ctx.note(
        f"(a) the writer took {_median([float(f['write_s']) for f in junk]):.2f} s for {JUNK_FILES:,} files; "
        f"all were quarantined {_median([float(f['quarantined_s']) for f in junk]):.2f} s after its first write"
    )
    ctx.note(
        f"(b) container side (medians): {DEFAULT_MAX_MESSAGES} messages "
        f"{_median([float(f['messages_s']) for f in sub]):.3f} s, "
        f"session of {sub[0]['session_bytes']:,} bytes {_median([float(f['session_s']) for f in sub]):.3f} s, "
        f"result {_median([float(f['result_s']) for f in sub]):.3f} s; spawn → everything sent to the chat "
        f"{_median([float(f['spawn_to_sent_s']) for f in sub]):.2f} s; {CEILING_MAX_MESSAGES:,} messages took "
        f"{_median([float(f['messages_s']) for f in ceiling]):.2f} s"
    )


async def run(ctx: BenchContext) -> list[Row]:
    configure_logging(level="INFO")  # the production default: what the host logs is part of its work
    rounds = ctx.scaled(3, 1)
    idle_seconds = 3.0 if ctx.quick else 5.0
    passes: list[Pass] = []
    with GcRecorder() as recorder:
        async with TelegramProcess() as tg, Peer(PEER_JUNK) as junk, Peer(PEER_CONTAINER) as box:
            for round_index in range(rounds):
                # Alternate which mode goes first, so neither always runs in the older process.
                order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    started = time.perf_counter()
                    passes.append(await _pass(ctx, tg, (junk, box), recorder, mode, len(passes), idle_seconds))
                    took = time.perf_counter() - started
                    print(
                        f"stall: pass {len(passes)}/{rounds * len(MODES)} ({mode}) took {took:.1f} s", file=sys.stderr
                    )
        print("stall: helpers stopped", file=sys.stderr)
    _notes(ctx, passes, rounds, idle_seconds)
    return _rows(passes)


if __name__ == "__main__":
    sys.exit(_peer_main(sys.argv[1:]))
