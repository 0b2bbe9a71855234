"""Streamed answers (issue 36): mention → first visible text against today's mention → whole answer, and Stop →
the provider's stream closed.

The full app on real PTB against the fake Bot API, the fake LLM (OpenAI's streaming API) writing a 600-token
answer (2,400 characters of Markdown as bench/markdown.py writes them, at 4 characters a token) at 30 tokens a
second: 20 s of model time. Two apps in the same run, alternating, each asked in CHATS chats at once per round:
STREAM_REPLIES on (the answer grows in one message) and off (the baseline: the whole answer at the end; a
request that does not stream is answered after the same 20 s, as a provider answers once it has generated it).
Each app answers one warm-up question first (its first turn loads pydantic-ai), which is not measured.
Everything else is the product's defaults (STREAM_EDIT_INTERVAL_SECONDS 3, STREAM_EDITS_PER_SECOND 20).

- mention → first visible text: from pushing the mention into the fake Bot API to the chat's first sendMessage
  (streaming on); the baseline's first visible text is its whole answer.
- mention → whole answer: to the final text on screen (streaming on: the outbox's edit that drops " …";
  off: the sendMessage).
- edits per minute per chat while written: the growing answer's writes after its first over the time between its
  first and last, against the one edit per STREAM_EDIT_INTERVAL_SECONDS the pacer allows; and the shortest gap
  between two writes of one chat.
- Stop → stream closed: a long answer at the same pace; once its first words show, its asker presses Stop; from
  pushing the press into the fake Bot API (so PTB's long poll is included) to the fake LLM seeing the streaming
  request's connection close (it notes the time of the hang-up). Both fakes serve in the app's event loop.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass

from bench.apps import bench_app
from bench.common import BenchContext, bench_settings, ms
from bench.markdown import answer
from bench.report import Measure, Row
from tests.fakes.llm_server import FakeLLM, StreamPace, openai_text
from tests.fakes.telegram_server import FakeTelegram

NAME = "streaming"
TOKENS = 600
CHARS_PER_TOKEN = 4
TOKENS_PER_SECOND = 30.0
PACE = StreamPace(piece_chars=CHARS_PER_TOKEN, seconds_per_piece=1.0 / TOKENS_PER_SECOND)
CHATS = 4  # asked at once per round and arm: well inside the global budget, so each chat's interval holds
STOP_CHATS = 5  # Stop presses per round, one chat after the other
API_KEY = "sk-bench-stream"
ASKER = 7001
WAIT_SECONDS = 120.0
MODEL_SECONDS = TOKENS / TOKENS_PER_SECOND  # the whole answer's generation, streamed or not
WRITING_MARK = " …"  # bot/agent/live_reply.py: after the text while it is still written


@dataclass(frozen=True, slots=True)
class Answered:
    """One chat's answer, seconds from the mention."""

    first_seconds: float
    whole_seconds: float
    growing_writes: list[float]  # monotonic times of the growing text's writes (streaming on)


def _writes(tg: FakeTelegram, chat_id: int) -> list[tuple[float, str]]:
    sent = [(m.at, m.plain_text) for m in tg.sent_messages(chat_id)]
    return sorted(sent + [(e.at, e.plain_text) for e in tg.edits(chat_id)])


def _final(tg: FakeTelegram, chat_id: int) -> float | None:
    """When the whole answer was on screen: the first write without the writing mark."""
    return next((at for at, text in _writes(tg, chat_id) if not text.endswith(WRITING_MARK)), None)


async def _ask(tg: FakeTelegram, llm: FakeLLM, chat_ids: list[int], text: str) -> list[Answered]:
    for _ in chat_ids:
        llm.openai.enqueue(openai_text(text))
    asked = {}
    for chat_id in chat_ids:
        asked[chat_id] = time.monotonic()
        tg.push_message(chat_id, f"@{tg.bot_username} walk me through it", user_id=ASKER, first_name="Ann")
    done: list[Answered] = []
    for chat_id in chat_ids:
        whole = await tg.wait_until(functools.partial(_final, tg, chat_id), WAIT_SECONDS)
        writes = _writes(tg, chat_id)
        growing = [at for at, shown in writes if shown.endswith(WRITING_MARK)]
        done.append(Answered(writes[0][0] - asked[chat_id], whole - asked[chat_id], growing))
    return done


async def _stop(tg: FakeTelegram, llm: FakeLLM, chat_id: int, text: str) -> float:
    """Seconds from the Stop press to the provider's stream closed."""
    llm.openai.enqueue(openai_text(text))
    gone = len(llm.disconnect_times())
    tg.push_message(chat_id, f"@{tg.bot_username} explain everything", user_id=ASKER, first_name="Ann")
    [live] = await tg.wait_for_messages(chat_id, 1, WAIT_SECONDS)
    [stop] = tg.buttons(chat_id, live.message_id)
    pressed = time.monotonic()
    tg.push_callback_query(chat_id, live.message_id, stop["callback_data"], user_id=ASKER, first_name="Ann")
    await llm.wait_for_disconnects(gone + 1, WAIT_SECONDS)
    return llm.disconnect_times()[gone] - pressed


def _per_minute(writes: list[float]) -> float | None:
    if len(writes) < 2 or writes[-1] <= writes[0]:
        return None
    return (len(writes) - 1) / (writes[-1] - writes[0]) * 60.0


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(3, 1)
    text = answer(TOKENS * CHARS_PER_TOKEN)
    results: dict[bool, list[Answered]] = {True: [], False: []}
    stops: list[float] = []
    chats = iter(range(10_000))
    interval = 0.0
    async with FakeTelegram() as tg, FakeLLM(api_key=API_KEY) as llm:
        llm.set_stream_pace(PACE)
        for index in range(rounds):
            for streaming in (True, False) if index % 2 == 0 else (False, True):
                chat_ids = [ctx.chat_id(next(chats)) for _ in range(CHATS + (STOP_CHATS if streaming else 0))]
                warm_up = ctx.chat_id(next(chats))
                for chat_id in [warm_up, *chat_ids]:
                    tg.add_chat(chat_id, title=f"bench streaming {chat_id}")
                settings = bench_settings(
                    ctx.work_dir / f"data-{index}-{streaming}",
                    token=tg.token,
                    base_url=tg.base_url,
                    ALLOWED_CHAT_IDS=",".join(str(c) for c in [warm_up, *chat_ids]),
                    LLM_PROVIDER="openai",
                    LLM_BASE_URL=llm.base_url,
                    LLM_API_KEY=API_KEY,
                    LLM_MODEL="fake-model",
                    STREAM_REPLIES=str(streaming).lower(),
                    STATUS_CARD="false",
                )
                interval = settings.stream_edit_interval_seconds
                async with bench_app(settings) as bench:
                    llm.set_delay(0.0)
                    llm.openai.enqueue(openai_text("Ready."))
                    tg.push_message(warm_up, f"@{tg.bot_username} ready?", user_id=ASKER)
                    await tg.wait_until(functools.partial(_final, tg, warm_up), WAIT_SECONDS)
                    await bench.app.wait_quiet(warm_up)
                    llm.set_delay(0.0 if streaming else MODEL_SECONDS)
                    results[streaming] += await _ask(tg, llm, chat_ids[:CHATS], text)
                    for chat_id in chat_ids[CHATS:]:
                        stops.append(await _stop(tg, llm, chat_id, text))
                        await bench.app.wait_quiet(chat_id)
                    for chat_id in chat_ids:
                        await bench.app.wait_quiet(chat_id)

    on, off = results[True], results[False]
    rates = [rate for a in on if (rate := _per_minute(a.growing_writes)) is not None]
    gaps = [b - a for answered in on for a, b in itertools.pairwise(answered.growing_writes)]
    allowed = 60.0 / interval
    ctx.note(
        f"{TOKENS} tokens ({len(text):,} characters) at {TOKENS_PER_SECOND:g} tokens/s, {CHATS} chats at once per "
        f"round and arm, {rounds} round(s), the arms alternating which goes first; {len(stops)} Stop presses"
    )
    ctx.note(
        f"growing writes per answer: {sorted(len(a.growing_writes) for a in on)}; shortest gap between two writes "
        f"of one chat {min(gaps):.2f} s (STREAM_EDIT_INTERVAL_SECONDS {interval:g})"
    )
    first = Measure.of([a.first_seconds for a in on])
    whole_off = Measure.of([a.whole_seconds for a in off])
    return [
        Row(
            NAME,
            "mention → first visible text (streaming on), against mention → whole answer (off)",
            "s",
            first,
            "whole answer, streaming off",
            whole_off,
        ),
        Row(
            NAME,
            "mention → whole answer on screen, streaming on, against off",
            "s",
            Measure.of([a.whole_seconds for a in on]),
            "streaming off",
            whole_off,
        ),
        Row(
            NAME,
            "edits per minute per chat while written",
            "/min",
            Measure.of(rates),
            "one per STREAM_EDIT_INTERVAL_SECONDS",
            Measure.figure(allowed),
        ),
        Row(
            NAME,
            "shortest gap between two writes of one chat",
            "s",
            Measure.figure(min(gaps), len(gaps)),
            "STREAM_EDIT_INTERVAL_SECONDS",
            Measure.figure(interval),
        ),
        Row(NAME, "Stop pressed → the provider's stream closed", "ms", Measure.of([ms(s) for s in stops])),
    ]
