"""Daily allowances: what reserving and settling add to a main-agent turn, against the same turn with the
allowances off and with no allowances at all, in the same run.

Three apps in this process, each the real `crewbot.app.App` on its own DATA_DIR (real SQLite), a recording
channel (tests/bot/helpers.py: sends are noted, nothing leaves the process) and one `FunctionModel` that
answers at once with a fixed reply and its usage (as a provider reports it), so the LLM's own time is ~0 and
what the allowances cost shows:
- *set*: CHAT_DAILY_TOKENS and DAILY_TOKENS set (far above what the run uses): each model request reserves
  against the chat's and the bot's allowance and settles to its use;
- *off*: both 0, the default: the same Allowances object still reserves (no allowance to check) and settles
  (the spend is counted);
- *none*: the main agent built with no Allowances object (nothing reserved, nothing counted). The bot has
  no such configuration (App always makes one); it shows what metering costs at all.
A turn: its chat's mention stored, `engine.notify` (as the router calls it) → the turn recorded as ended:
the turn's start recorded, `left_for` (the turn's admission), the prompt from the store, the agent's run with
one model request (reserve → model → settle), the reply stored and sent, the turn's end recorded. Each chat
holds a full history window before the first turn. One turn per arm per round, the order rotated; the
added time is set − off (and set − none) per round. `gc.freeze()` after start-up, as crewbot/serve.py does.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from bench.common import BenchContext, bench_settings, ms
from bench.report import Measure, Row
from core.allowances import Allowances, Reservation
from core.store.messages import NewMessage
from core.store.spend import SpendKind, SpendStore
from core.store.turns import TurnStatus
from core.stores import Stores
from crewbot.app import App
from tests.bot.helpers import RecordingChannel

NAME = "allowance"
ARMS = ("set", "off", "none")
REPLY = "Sure, noted."
USAGE = RequestUsage(input_tokens=1_500, output_tokens=20)
CHAT_TOKENS = 1_000_000_000  # far above a run's use: no turn is refused, no 80 % notice
BOT_TOKENS = 10_000_000_000
WARMUP_ROUNDS = 30
TURN_TIMEOUT_SECONDS = 30.0
OFF_LABEL = "the same turn, allowances off (0: spend still counted), same round"


async def _answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The provider: answers at once (async, so no executor thread), reporting its usage."""
    return ModelResponse(parts=[TextPart(REPLY)], usage=USAGE)


class TimedAllowances(Allowances):
    """The product's allowances; notes how long each admission (`left_for`), reserve and settle took (ms)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times: dict[str, list[float]] = {"left_for": [], "reserve": [], "settle": []}
        self._in_left_for = False

    async def left_for(self, chat_id: int) -> str | None:
        started = time.perf_counter()
        self._in_left_for = True
        try:
            return await super().left_for(chat_id)
        finally:
            self._in_left_for = False
            self.times["left_for"].append(ms(time.perf_counter() - started))

    async def reserve(self, chat_id: int, kind: SpendKind, estimate: int) -> Reservation:
        started = time.perf_counter()
        try:
            return await super().reserve(chat_id, kind, estimate)
        finally:
            if not self._in_left_for:
                self.times["reserve"].append(ms(time.perf_counter() - started))

    async def settle(
        self,
        reservation: Reservation,
        input_tokens: int,
        output_tokens: int,
        *,
        estimated: bool,
        audio_seconds: float = 0.0,
    ) -> None:
        started = time.perf_counter()
        try:
            await super().settle(
                reservation, input_tokens, output_tokens, estimated=estimated, audio_seconds=audio_seconds
            )
        finally:
            self.times["settle"].append(ms(time.perf_counter() - started))

    def clear(self) -> None:
        for samples in self.times.values():
            samples.clear()


@dataclass(slots=True)
class _Arm:
    key: str
    app: App
    chat_id: int
    allowances: TimedAllowances | None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    statuses: list[TurnStatus] = field(default_factory=list)
    turns: list[float] = field(default_factory=list)
    statements: dict[str, int] = field(default_factory=dict)

    def watch(self) -> None:
        """Note each turn's end (after the recorder wrote it): an instance attribute shadows the method."""
        recorder = self.app.recorder
        ended = recorder.turn_ended

        async def turn_ended(turn: Any, status: TurnStatus) -> None:
            await ended(turn, status)
            self.statuses.append(status)
            self.ended.set()

        setattr(recorder, "turn_ended", turn_ended)  # noqa: B010

    async def turn(self, index: int) -> float:
        """One member's mention stored, the turn notified; ms until its end was recorded."""
        messages = self.app.stores.messages
        row_id = await messages.add(
            NewMessage(
                chat_id=self.chat_id, sender_name="Alice", content=f"@crew ping {index}", sender_id=5, is_trigger=True
            )
        )
        self.ended.clear()
        started = time.perf_counter()
        self.app.engine.notify(self.chat_id, row_id)
        await asyncio.wait_for(self.ended.wait(), TURN_TIMEOUT_SECONDS)
        took = ms(time.perf_counter() - started)
        await self.app.typing.wait_idle(self.chat_id)  # the engine's worker lets go right after the end
        return took


@asynccontextmanager
async def _arm(ctx: BenchContext, key: str, index: int) -> AsyncIterator[_Arm]:
    tokens: dict[str, Any] = {"CHAT_DAILY_TOKENS": CHAT_TOKENS, "DAILY_TOKENS": BOT_TOKENS} if key == "set" else {}
    settings = bench_settings(ctx.work_dir / key, MERGE_WINDOW_SECONDS=0, STATUS_CARD="false", **tokens)
    stores = await Stores.open(settings)
    allowances = TimedAllowances(settings, SpendStore(stores.db)) if key != "none" else None
    model = FunctionModel(_answer)
    app = App(settings, RecordingChannel(), stores, model=model, allowances=allowances)
    if allowances is None:
        app.agent._allowances = None  # the main agent unmetered: what the turn costs with no allowances at all
    try:
        await app.start()
    except BaseException:
        await app.stop()
        raise
    try:
        arm = _Arm(key, app, ctx.chat_id(index), allowances)
        await _fill_history(arm, settings.history_window_messages)
        arm.watch()
        yield arm
    finally:
        await app.stop()


async def _fill_history(arm: _Arm, window: int) -> None:
    """A full history window, so every measured turn's prompt is as long as in a busy chat."""
    await arm.app.stores.chats.ensure(arm.chat_id, "supergroup", f"bench allowance {arm.key}")
    start = time.time() - window * 60
    for k in range(window):
        bot = k % 4 == 3
        await arm.app.stores.messages.add(
            NewMessage(
                chat_id=arm.chat_id,
                sender_name="Crew" if bot else f"User {k % 5}",
                content=f"message {k}: a line of ordinary chat text, neither short nor long.",
                sender_id=None if bot else 3000 + k % 5,
                timestamp=start + k * 60,
                is_bot=bot,
            )
        )


def _rotated(arms: list[_Arm], index: int) -> list[_Arm]:
    shift = index % len(arms)
    return [*arms[shift:], *arms[:shift]]


async def _count_statements(arm: _Arm, index: int) -> None:
    """One more turn with SQLite's trace on: the statements it ran, by their first words and table."""
    seen: list[str] = []
    conn = arm.app.stores.db.conn
    await conn.set_trace_callback(seen.append)
    try:
        await arm.turn(index)
    finally:
        await conn.set_trace_callback(None)  # type: ignore[arg-type]  # sqlite3 takes None: trace off
    for statement in seen:
        words = statement.split()
        verb = words[0].upper() if words else "?"
        table = next((w for w in words if w.startswith(("llm_", "chat_allowance", "allowance_"))), "")
        key = f"{verb} {table}".strip() if table else verb
        arm.statements[key] = arm.statements.get(key, 0) + 1


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(1500, 300)
    async with AsyncExitStack() as stack:
        arms = [await stack.enter_async_context(_arm(ctx, key, i)) for i, key in enumerate(ARMS)]
        gc.collect()
        gc.freeze()  # as crewbot/serve.py does once the bot has started
        for index in range(WARMUP_ROUNDS + rounds):
            for arm in _rotated(arms, index):
                took = await arm.turn(index)
                if index >= WARMUP_ROUNDS:
                    arm.turns.append(took)
            if index == WARMUP_ROUNDS - 1:
                for arm in arms:
                    if arm.allowances is not None:
                        arm.allowances.clear()
        for arm in arms:
            await _count_statements(arm, WARMUP_ROUNDS + rounds)
        _check(arms, rounds)
        await _notes(ctx, arms, rounds)
        rows = _rows(arms)
    gc.unfreeze()
    return rows


def _check(arms: list[_Arm], rounds: int) -> None:
    """Every turn completed and answered with the model's reply (no notice, no apology)."""
    for arm in arms:
        wrong = [s for s in arm.statuses if s is not TurnStatus.COMPLETED]
        channel = arm.app.channel
        assert isinstance(channel, RecordingChannel)
        replies = channel.texts(arm.chat_id)
        if wrong or len(replies) != WARMUP_ROUNDS + rounds + 1 or not all(r.endswith(REPLY) for r in replies):
            raise RuntimeError(f"{arm.key}: turns ended {set(arm.statuses)}, {len(replies)} replies {set(replies)}")


async def _notes(ctx: BenchContext, arms: list[_Arm], rounds: int) -> None:
    ctx.note(
        f"{rounds} rounds after {WARMUP_ROUNDS} warm-up, one turn per arm each, the order rotated; one model request "
        f"per turn (a FunctionModel answering at once, usage {USAGE.input_tokens:,} + {USAGE.output_tokens} tokens)"
    )
    for arm in arms:
        statements = ", ".join(f"{k} ×{n}" for k, n in sorted(arm.statements.items()))
        ctx.note(f"SQL statements of one turn, {arm.key}: {statements}")
    for arm in arms:
        if arm.allowances is not None:
            spend = await SpendStore(arm.app.stores.db).rows(arm.allowances.today(), arm.chat_id)
            counted = sum(row.spend.calls for row in spend)
            ctx.note(f"{arm.key}: {counted:,} model requests counted in llm_spend (every turn's, warm-up included)")


def _diffs(a: list[float], b: list[float]) -> list[float]:
    return [x - y for x, y in zip(a, b, strict=True)]


def _rows(arms: list[_Arm]) -> list[Row]:
    by = {arm.key: arm for arm in arms}
    turn_set, turn_off, turn_none = (Measure.of(by[k].turns) for k in ARMS)
    rows = [
        Row(
            NAME,
            "main-agent turn (one model request), CHAT_DAILY_TOKENS and DAILY_TOKENS set",
            "ms",
            turn_set,
            OFF_LABEL,
            turn_off,
        ),
        Row(
            NAME,
            "the same turn, allowances off (0): reserved and settled, spend counted",
            "ms",
            turn_off,
            "the same turn with no Allowances object (nothing reserved or counted), same round",
            turn_none,
        ),
        Row(
            NAME,
            "added by the allowances set: set − off, per round (goal ≤ 1 ms p50)",
            "ms",
            Measure.of(_diffs(by["set"].turns, by["off"].turns)),
        ),
        Row(
            NAME,
            "added by metering, allowances set: set − no Allowances object, per round",
            "ms",
            Measure.of(_diffs(by["set"].turns, by["none"].turns)),
        ),
    ]
    for key in ("set", "off"):
        allowances = by[key].allowances
        assert allowances is not None
        for what, label in (
            ("left_for", "the turn's admission (left_for: reserve 1 + release)"),
            ("reserve", "a model request's reserve"),
            ("settle", "its settle"),
        ):
            rows.append(Row(NAME, f"{label}, allowances {key}", "ms", Measure.of(allowances.times[what])))
    return rows
