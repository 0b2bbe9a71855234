"""Files in and out of a subagent's container: a 10 MB document posted until the container has read it whole,
and a 10 MB file the container sends until Telegram has accepted it.

The full app (real PTB, SQLite, task manager, run channels, Docker runtime; offline models, merge window 0)
against the fake Bot API in a process of its own (bench/tg_process.py), so serving and parsing 10 MB is not
the bot's work. Each sample is a fresh chat (its own Telegram flood budget and workspace), one container at a
time. Clocks: the container's `date +%s.%N` and the host's `time.time()` read the same kernel clock.

- in: a member posts a 10 MB document (random bytes) with the caption `@bot background: $ sha256sum
  inbox/big.bin && date +%s.%N`. **Start**: the update is queued in the fake (its answer to the post). **Stop**:
  the `date` the container printed after `sha256sum` finished, its hash checked against the posted bytes'.
  Between them: the main agent's turn and spawn, the host's one download (DATA_DIR/files/in), the container's
  start, its fetch over the run's socket into /workspace/inbox, a model step and the hash itself.
  Second baseline: the same with no file (a text message, `sha256sum /dev/null`), in the same round; the
  file's share is the difference, per round.
- out: `$ head -c 10485760 /dev/urandom > out.bin && sha256sum out.bin && date +%s.%N ;; send_file out.bin`.
  **Start**: that `date` (the file is written; the next model step calls send_file). **Stop**: the fake Bot
  API accepted the sendDocument (its bytes' hash checked against the container's). Stages: the host recorded
  the file (upload over the run's socket, written under DATA_DIR/files/out; its run_files row's time).
- Baseline for both: the same 10 MB through a Unix socketpair in this process (one thread sends, one
  receives), three per round, interleaved with the runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.apps import BenchApp, FirstCallProbe, TimedFileSource, bench_app
from bench.common import BenchContext, bench_settings, ms, poll_until
from bench.report import Measure, Row
from bench.tg_process import TelegramProcess
from core.store.run_files import Direction
from core.store.run_record import RunRecord
from runner.runtimes.runtime import container_name
from runner.service import SubagentService

NAME = "files"
MB = 1024 * 1024  # as the product reads sizes (core.store.chat_files.size_text)
SIZE_BYTES = 10 * MB
WARMUP_ROUNDS = 1
SOCKET_SAMPLES_PER_ROUND = 3
RUN_TIMEOUT_SECONDS = 90.0
IN_NAME = "big.bin"
OUT_NAME = "out.bin"
STAMP = "date +%s.%N"
IN_TASK = f"$ sha256sum inbox/{IN_NAME} && {STAMP}"
NO_FILE_TASK = f"$ sha256sum /dev/null && {STAMP}"
OUT_TASK = (
    f"$ head -c {SIZE_BYTES} /dev/urandom > {OUT_NAME} && sha256sum {OUT_NAME} && {STAMP} ;; send_file {OUT_NAME}"
)
_HASH = re.compile(r"\b[0-9a-f]{64}\b")
_WALL_STAMP = re.compile(r"\b\d{10}\.\d{9}\b")
SOCKET_LABEL = "the same 10 MB through a Unix socketpair (one process, two threads)"
NO_FILE_LABEL = "the same with no file (`sha256sum /dev/null`), same round"

# Where an in-run's time goes: each stage from the stamp before it (ms after the post).
IN_STAGES = (
    ("recorded", "", "posted → run recorded (the main agent's turn, its spawn request picked up)"),
    ("running", "recorded", "→ run marked running (the file downloaded into DATA_DIR/files/in; task, channel)"),
    ("started", "running", "→ the engine's container start returned"),
    ("first_call", "started", "→ the agent's first model step (Python; the file fetched into inbox/ first)"),
    ("done", "first_call", "→ `sha256sum` done (a model step, the command, the hash)"),
)


@dataclass(slots=True)
class _Rig:
    ctx: BenchContext
    tg: TelegramProcess
    bench: BenchApp
    service: SubagentService
    probe: FirstCallProbe
    downloads: TimedFileSource
    chats: list[int]
    statuses: list[str] = field(default_factory=list)

    def next_chat(self) -> int:
        return self.chats.pop(0)

    async def run_of(self, chat_id: int) -> RunRecord:
        """The chat's run once its final status is in and its container is gone."""

        async def spawned() -> RunRecord | None:
            found = await self.service.runs.for_chat(chat_id, 1)
            return found[0] if found else None

        run = await poll_until(spawned, RUN_TIMEOUT_SECONDS, f"a run in chat {chat_id}")
        self.statuses.append(await self.bench.wait_run_done(run.id, RUN_TIMEOUT_SECONDS))
        done = await self.service.runs.get(run.id)
        assert done is not None
        if done.status != "completed":
            raise RuntimeError(f"run {run.id} ended {done.status}: {done.error or done.result}")
        return done


def _printed(record: RunRecord) -> tuple[str, float]:
    """The hash and the `date` the run's command printed (from its result)."""
    text = record.result or ""
    hashes, stamps = _HASH.findall(text), _WALL_STAMP.findall(text)
    if not hashes or not stamps:
        raise RuntimeError(f"run {record.id} printed no hash and time: {text[:300]!r}")
    return hashes[-1], float(stamps[-1])


async def _in_sample(rig: _Rig, with_file: bool) -> dict[str, float]:
    """One in-run (ms after the post per stamp); with_file False: the same command on no file."""
    chat_id = rig.next_chat()
    path: Path | None = None
    expected = hashlib.sha256(b"").hexdigest()
    if with_file:
        data = os.urandom(SIZE_BYTES)
        expected = hashlib.sha256(data).hexdigest()
        path = rig.ctx.work_dir / f"in-{-chat_id}.bin"
        await asyncio.to_thread(path.write_bytes, data)
    task = IN_TASK if with_file else NO_FILE_TASK
    downloads_before = len(rig.downloads.downloads)
    to_wall = time.time() - time.perf_counter()
    posted = await rig.tg.post(chat_id, f"@{rig.tg.bot_username} background: {task}", path, IN_NAME)
    record = await rig.run_of(chat_id)
    if path is not None:
        path.unlink()
    digest, done = _printed(record)
    if digest != expected:
        raise RuntimeError(f"run {record.id} hashed {digest}, the posted bytes are {expected}")
    assert record.started_at is not None
    stamps = {
        "recorded": record.created_at,
        "running": record.started_at,
        "started": rig.bench.subagents()[1].started[container_name(record.id)][1] + to_wall,
        "first_call": rig.probe.first[record.id] + to_wall,
        "done": done,
    }
    sample = {key: ms(at - posted) for key, at in stamps.items()}
    if with_file:
        (_, asked, returned), *_ = rig.downloads.downloads[downloads_before:]
        sample["download"] = ms(returned - asked)
    return sample


async def _out_sample(rig: _Rig) -> dict[str, float]:
    """One out-run: ms from the container's `date` (file written) to the host's record and to Telegram's."""
    chat_id = rig.next_chat()
    await rig.tg.post(chat_id, f"@{rig.tg.bot_username} background: {OUT_TASK}")
    record = await rig.run_of(chat_id)
    digest, written = _printed(record)

    async def accepted() -> list[dict[str, object]] | None:
        sent = await rig.tg.files(chat_id)
        return sent or None

    await poll_until(accepted, RUN_TIMEOUT_SECONDS, f"the file sent to chat {chat_id}")
    (sent,) = await rig.tg.files(chat_id, hashes=True)
    if (sent["sha256"], sent["size_bytes"], sent["file_name"]) != (digest, SIZE_BYTES, OUT_NAME):
        raise RuntimeError(f"Telegram got {sent} from run {record.id}, which wrote {digest}")
    (out,) = [f for f in await rig.service.run_files.of_run(record.id) if f.direction is Direction.OUT]
    return {
        "recorded": ms(out.created_at - written),
        "accepted": ms(float(sent["accepted_at"]) - written),
    }


def _socket_copy_seconds(data: bytes) -> float:
    """`data` through a Unix socketpair: a thread sends it all, this one receives it into a buffer."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    received = bytearray(len(data))
    view = memoryview(received)

    def send() -> None:
        with left:
            left.sendall(data)

    with right:
        started = time.perf_counter()
        sender = threading.Thread(target=send, name="socketpair-send")
        sender.start()
        got = 0
        while got < len(data):
            count = right.recv_into(view[got:])
            if count == 0:
                raise RuntimeError(f"the socketpair closed after {got} bytes")
            got += count
        elapsed = time.perf_counter() - started
        sender.join()
    if received != data:
        raise RuntimeError("the socketpair garbled the bytes")
    return elapsed


def _hash_seconds(data: bytes) -> float:
    started = time.perf_counter()
    hashlib.sha256(data).digest()
    return time.perf_counter() - started


def _rate(milliseconds: float) -> float:
    return (SIZE_BYTES / MB) / (milliseconds / 1000.0)


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(12, 3)
    chats = [ctx.chat_id(i) for i in range(3 * (WARMUP_ROUNDS + rounds))]
    with_file: list[dict[str, float]] = []
    no_file: list[dict[str, float]] = []
    out: list[dict[str, float]] = []
    socket_ms: list[float] = []
    async with TelegramProcess() as tg:
        settings = bench_settings(
            ctx.work_dir / "data",
            token=tg.token,
            base_url=tg.base_url,
            ALLOWED_CHAT_IDS=",".join(str(c) for c in chats),
            MERGE_WINDOW_SECONDS=0,
        )
        async with bench_app(settings, with_subagents=True) as bench:
            service, _ = bench.subagents()
            assert bench.downloads is not None
            rig = _Rig(ctx, tg, bench, service, FirstCallProbe(service.live), bench.downloads, chats)
            payload = os.urandom(SIZE_BYTES)
            for index in range(WARMUP_ROUNDS + rounds):
                # One container at a time; the two in-runs swap places each round.
                first, second = (True, False) if index % 2 == 0 else (False, True)
                runs = {first: await _in_sample(rig, first), second: await _in_sample(rig, second)}
                sent = await _out_sample(rig)
                copies = [
                    await asyncio.to_thread(_socket_copy_seconds, payload) for _ in range(SOCKET_SAMPLES_PER_ROUND)
                ]
                if index < WARMUP_ROUNDS:
                    continue
                with_file.append(runs[True])
                no_file.append(runs[False])
                out.append(sent)
                socket_ms.extend(ms(seconds) for seconds in copies)
            hashing = min([await asyncio.to_thread(_hash_seconds, payload) for _ in range(3)])
    ctx.note(
        f"{rounds} rounds after {WARMUP_ROUNDS} warm-up, each: a run with the file, one without (order swapped "
        f"each round), an out-run, {SOCKET_SAMPLES_PER_ROUND} socketpair copies; a fresh chat per run; "
        f"MERGE_WINDOW_SECONDS=0 (a group's default adds 3 s before the turn); image {settings.subagent_image}"
    )
    ctx.note(
        f"10 MB = {SIZE_BYTES:,} random bytes (MB = 2^20 bytes, as the bot shows sizes); sha256 of them in this "
        f"process takes {ms(hashing):.0f} ms: the container's `sha256sum` is part of the in-run's file share"
    )
    shares = [a["done"] - b["done"] for a, b in zip(with_file, no_file, strict=True)]
    if any(share <= 0 for share in shares):
        ctx.note(f"in some rounds the run with the file was not slower than the one without: {shares}")
    return _rows(with_file, no_file, out, socket_ms)


def _rows(
    with_file: list[dict[str, float]], no_file: list[dict[str, float]], out: list[dict[str, float]], socket: list[float]
) -> list[Row]:
    copy = Measure.of(socket)
    copy_rate = Measure.rates([_rate(value) for value in socket])
    done = Measure.of([s["done"] for s in with_file])
    share = [a["done"] - b["done"] for a, b in zip(with_file, no_file, strict=True)]
    accepted = [s["accepted"] for s in out]
    rows = [
        Row(
            NAME,
            "in, a 10 MB document: posted → `sha256sum inbox/big.bin` done in the container",
            "ms",
            done,
            SOCKET_LABEL,
            copy,
        ),
        Row(
            NAME,
            "in: the same (posted → done, with the file)",
            "ms",
            done,
            NO_FILE_LABEL,
            Measure.of([s["done"] for s in no_file]),
        ),
        Row(
            NAME,
            "in: the file's share (with the file − without, per round)",
            "ms",
            Measure.of(share),
            SOCKET_LABEL,
            copy,
        ),
        Row(
            NAME,
            "in: the file's share as a rate",
            "MB/s",
            Measure.rates([_rate(v) for v in share if v > 0]),
            SOCKET_LABEL,
            copy_rate,
        ),
        Row(
            NAME,
            "in: the host's download from the Bot API (download_file called → bytes in hand)",
            "ms",
            Measure.of([s["download"] for s in with_file]),
            SOCKET_LABEL,
            copy,
        ),
    ]
    for key, since, label in IN_STAGES:

        def stage(samples: list[dict[str, float]], key: str = key, since: str = since) -> Measure:
            return Measure.of([s[key] - (s[since] if since else 0.0) for s in samples])

        rows.append(
            Row(
                NAME, f"in, where the time goes: {label}", "ms", stage(with_file), "no file, same round", stage(no_file)
            )
        )
    rows += [
        Row(
            NAME,
            "out, 10 MB: file written in the container (`date`) → Telegram accepted the sendDocument",
            "ms",
            Measure.of(accepted),
            SOCKET_LABEL,
            copy,
        ),
        Row(
            NAME,
            "out: the same as a rate",
            "MB/s",
            Measure.rates([_rate(v) for v in accepted]),
            SOCKET_LABEL,
            copy_rate,
        ),
        Row(
            NAME,
            "out, where the time goes: → the host recorded the file (a model step, the upload over the run's "
            "socket, written under DATA_DIR/files/out)",
            "ms",
            Measure.of([s["recorded"] for s in out]),
        ),
        Row(
            NAME,
            "out, where the time goes: → Telegram accepted (the outbox, PTB's multipart upload)",
            "ms",
            Measure.of([s["accepted"] - s["recorded"] for s in out]),
        ),
    ]
    return rows
