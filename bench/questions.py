"""A human in the loop: how soon a tap reaches the run that waits for it.

In one process, no Docker: the real subagent service (SQLite, run channels on Unix sockets, the task manager)
on the in-memory runtime, whose "container" is the container's own channel client (`container.channel.RunChannel`)
in this process, as tests/runner/lifecycle drives it. Telegram's part (the callback query's trip to the bot and
PTB's dispatch) is not in it: the clock starts where the router hands the press to the question presses.

- press → answer: a run asks (`POST /run/ask`, the `ask_chat` tool's request); once the question is shown, the
  press is handled (`QuestionPresses.press`: store lookup, presser check, the answer stored, the waiter woken)
  and the clock stops when the container's request returns the answer. Baseline: one progress message
  (`POST /run/message`: a store write and the outbox) from the same container, same round.
- held connection → released: the run's door in ask mode holds a CONNECT to an unlisted host while the chat is
  asked; the clock starts at the decision (Allow once) and stops when the client reads `200 Connection
  established`. Baseline: the whole CONNECT to a listed address (no question), same round.
The issue's goal: press → the container has its answer ≤ 100 ms.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import time
from pathlib import Path

from bench.common import BenchContext, ms
from bench.report import Measure, Row
from bot.channels.buttons import CardAction, CardPress
from bot.question_presses import QuestionPresses
from container.channel import RunChannel
from core.egress_rules import EgressMode, IpAddress, parse_entry
from core.store.questions import Question
from runner.egress.door import EgressDoor
from runner.egress.records import EgressEvent, EgressRules, HostDecision
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import CHAT_ID, rig

NAME = "questions"
WARMUP = 2
HEAD_END = b"\r\n\r\n"
LOOPBACK = ipaddress.ip_address("127.0.0.1")  # listed as an ip:port entry: stands for a public host here


class _Board:
    def __init__(self) -> None:
        self.shown: asyncio.Queue[Question] = asyncio.Queue()

    async def show(self, question: Question, reply_to: int | None) -> int | None:
        await self.shown.put(question)
        return None

    async def settle(self, question: Question) -> None:
        return None


async def _always(chat_id: int, user_id: int) -> bool:
    return True


async def _press_samples(ctx: BenchContext, count: int) -> tuple[list[float], list[float]]:
    channels: asyncio.Queue[RunChannel] = asyncio.Queue()
    hold = asyncio.Event()

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await channels.put(channel)
        await hold.wait()
        return 0

    presses, baseline = [], []
    async with rig(ctx.work_dir / "press", behaviour, SUBAGENT_MAX_QUESTIONS=100, SUBAGENT_MAX_MESSAGES=1000) as r:
        board = _Board()
        r.service.questions.show_on(board)
        answers = QuestionPresses(r.service.questions, r.service.runs, r.stores.turns, _always)
        await r.spawn("ask many")
        channel = await channels.get()
        for index in range(count + WARMUP):
            asking = asyncio.create_task(channel.ask(f"ask-{index:06d}", "Which file?", ["a.txt", "b.txt"]))
            question = await board.shown.get()
            press = CardPress(
                chat_id=CHAT_ID,
                chat_kind="group",
                user_id=1001,
                user_name="Alice",
                action=CardAction.ANSWER,
                run_id=question.id,
                press_id=secrets.token_hex(4),
                option=1,
            )
            started = time.perf_counter()
            await answers.press(press)
            answer = await asking
            took = time.perf_counter() - started
            if answer.get("answer") != "b.txt":
                ctx.note(f"a press gave the container {answer!r}")
            started = time.perf_counter()
            await channel.send_message(f"msg-{index:06d}", "progress")
            message = time.perf_counter() - started
            if index >= WARMUP:
                presses.append(ms(took))
                baseline.append(ms(message))
        hold.set()
    return presses, baseline


async def _door_samples(ctx: BenchContext, count: int) -> tuple[list[float], list[float]]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    released, listed = [], []
    try:
        for index in range(count + WARMUP):
            took, whole = await _held_once(ctx.work_dir / f"door-{index}.sock", port)
            if index >= WARMUP:
                released.append(ms(took))
                listed.append(ms(whole))
    finally:
        server.close()
    return released, listed


async def _held_once(path: Path, port: int) -> tuple[float, float]:
    """One held CONNECT released by Allow once (seconds from the decision), then a CONNECT to the listed address."""
    decision: asyncio.Future[HostDecision] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    async def asker(host: str, port: int) -> HostDecision:
        asked.set()
        return await decision

    async def resolver(host: str, port: int) -> list[IpAddress]:
        return [LOOPBACK]

    rules = EgressRules(EgressMode.ASK, (parse_entry(f"127.0.0.1:{port}"),), 1 << 30, 16)
    door = EgressDoor(path, rules, on_event=_ignore, resolver=resolver, asker=asker)
    await door.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(f"CONNECT held.test:{port} HTTP/1.1\r\n\r\n".encode())
        await asked.wait()
        started = time.perf_counter()
        decision.set_result(HostDecision.ALLOW_ONCE)
        await reader.readuntil(HEAD_END)
        took = time.perf_counter() - started
        writer.close()
        started = time.perf_counter()
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        await reader.readuntil(HEAD_END)
        whole = time.perf_counter() - started
        writer.close()
    finally:
        await door.close()
    return took, whole


def _ignore(event: EgressEvent) -> None:
    return None


async def run(ctx: BenchContext) -> list[Row]:
    count = ctx.scaled(50, 5)
    presses, messages = await _press_samples(ctx, count)
    released, listed = await _door_samples(ctx, count)
    ctx.note(f"{count} questions and {count} held connections (after {WARMUP} warm-up each), in one process")
    return [
        Row(
            bench=NAME,
            metric="press → the container has its answer (ask_chat)",
            unit="ms",
            result=Measure.of(presses),
            baseline_label="one progress message over the same channel",
            baseline=Measure.of(messages),
        ),
        Row(
            bench=NAME,
            metric="Allow → the held connection is established (ask mode)",
            unit="ms",
            result=Measure.of(released),
            baseline_label="a whole CONNECT to a listed address",
            baseline=Measure.of(listed),
        ),
    ]
