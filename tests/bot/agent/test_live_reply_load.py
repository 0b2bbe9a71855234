"""Streamed answers under load and in mid-answer tool calls (issue 36, bad input): 20 chats streaming at once stay
inside each chat's interval and the global budget; a tool call mid-answer keeps the text before it and shows
what it started; a model streaming one character at a time is edited as often as the interval allows, not once
a chunk. The real app on real PTB against the fake Bot API, which records every write with its time.

What the fake can see: the pacer (bot/channels/edit_pacer.py) spaces the *turns* writers take, on the app's
clock; a write's request reaches the fake a little after its turn (the text rendered, the chat's address read
from the store, PTB, HTTP), and not always by the same amount. Both are this process's time.monotonic(), so a
gap the fake sees is the pacer's gap give or take that lag: the assertions allow LAG_SECONDS. With the fakes on
threads of their own the lag measured up to some 0.4 s on an idle machine, mostly while the 20 answers begin (up
to 13 writes in a second, 10 in 0.7 s, for 10 a second allowed; the pacer's turns: 11 and 8), and up to some
0.7 s while other work used both cores (13 writes in 0.6 s). So the budget of all chats together is checked over
windows of BUDGET_WINDOW_SECONDS, where that bunching is small against what 20 unpaced chats would write. The
outbox's final edit of each answer is not paced (it goes at once when the answer is complete), so the budgets are
asserted on the writes of growing answers.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic_ai.models import override_allow_model_requests

from bot.agent.live_reply import WRITING_MARK
from bot.agent.streamed_turn import NOTE_MARK
from crewbot.app import App
from tests.bot.agent.stream_rig import API_KEY, Write, shown, stored_answers, streaming_bot, writes
from tests.fakes.llm_server import FakeLLM, StreamPace, openai_text, openai_tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

LAG_SECONDS = 0.9  # how much later than its turn a write may reach the fake (see above)
OPEN_LAG_SECONDS = 0.4  # the lag that marks when all 20 streams are open (a longer one leaves no such time)
BUDGET_WINDOW_SECONDS = 3.0
STEADY_LAG_SECONDS = 0.2  # the same, for one chat streaming alone (its own loop: less)
CHATS = [-2001 - n for n in range(20)]
INTERVAL_SECONDS = 1.0  # STREAM_EDIT_INTERVAL_SECONDS (its least)
EDITS_PER_SECOND = 10  # STREAM_EDITS_PER_SECOND; 20 chats at one write per INTERVAL_SECONDS would want 20


@asynccontextmanager
async def _threaded_bot(
    tmp_path: Path, pace: StreamPace, **overrides: Any
) -> AsyncIterator[tuple[App, FakeTelegram, FakeLLM]]:
    """streaming_bot's app, with the fakes on threads of their own: the times they record are when a request
    came, not when the test's loop (the app's, busy with 20 streams) got to it, and their work is not the app's."""
    with FakeTelegram() as tg, FakeLLM(api_key=API_KEY) as llm:
        llm.set_stream_pace(pace)
        values: dict[str, Any] = {
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": llm.base_url,
            "LLM_API_KEY": API_KEY,
            "LLM_MODEL": "fake-model",
            "STREAM_REPLIES": "true",
            "STREAM_EDIT_INTERVAL_SECONDS": INTERVAL_SECONDS,
            "STREAM_EDITS_PER_SECOND": EDITS_PER_SECOND,
        }
        with override_allow_model_requests(True):
            async with telegram_app(make_settings(tmp_path, tg, **(values | overrides))) as app:
                yield app, tg, llm


def _answer_for(topic: int) -> str:
    """About 3,000 characters, some 750 tokens of four characters (long enough that all 20 stream together for
    several of their stretched intervals, even when other work slows their start); plain words, as users see it."""
    return f"Answer on topic {topic}: " + " ".join(f"w{topic}x{n}" for n in range(400)) + "."


def _by_topic(body: dict[str, Any]) -> dict[str, Any]:
    found = re.search(r"topic-(\d+)", json.dumps(body["messages"][-1]))
    assert found is not None, body["messages"][-1]
    return openai_text(_answer_for(int(found[1])))


def _shows(tg: FakeTelegram, chat: int, final: str) -> bool | None:
    return shown(tg, chat) == [final] or None


def _growing(seen: list[Write]) -> list[Write]:
    """The writes of an answer while it was written (the pacer's), without the outbox's final edit."""
    return [w for w in seen if w.text.endswith(WRITING_MARK)]


def _busiest(times: list[float], window_seconds: float) -> int:
    """The most writes in any window [t, t + window_seconds) (sliding: each write opens one)."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u < t + window_seconds) for i, t in enumerate(times)), default=0)


def _gaps(own: list[Write]) -> list[float]:
    return [b.at - a.at for a, b in itertools.pairwise(own)]


async def test_twenty_chats_streaming_at_once_keep_each_chats_interval_and_the_global_budget(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=16, seconds_per_piece=0.06)  # some 65 tokens a second: about 12 s an answer
    allowed = ",".join(str(chat) for chat in CHATS)
    async with _threaded_bot(tmp_path, pace, ALLOWED_CHAT_IDS=allowed) as (app, tg, llm):
        tg.limit_group_writes(20, 60.0)  # Telegram's limit of a group: 20 messages a minute, edits included
        llm.openai.handle_with(_by_topic)
        for number, chat in enumerate(CHATS):  # all at once: 20 updates in one getUpdates answer
            tg.push_message(chat, f"@{tg.bot_username} tell me about topic-{number}", first_name="Ann")
        await llm.wait_for_requests(len(CHATS), timeout_seconds=30)
        for number, chat in enumerate(CHATS):
            final = f"Crew: {_answer_for(number)}"
            await tg.wait_until(functools.partial(_shows, tg, chat, final), timeout_seconds=30)
            await app.wait_quiet(chat)
        seen = {chat: writes(tg, chat) for chat in CHATS}
        for number, chat in enumerate(CHATS):
            final = f"Crew: {_answer_for(number)}"
            assert len(tg.sent_messages(chat)) == 1, chat  # one message, grown by edits
            assert [w.text for w in seen[chat]].count(final) == 1 and seen[chat][-1].text == final  # once, last
            assert await stored_answers(app, chat) == [(_answer_for(number), "reply")]
    assert tg.rate_refusals() == []  # no group was written to past its limit
    # The fake has no limit for all chats together: the writes' times are checked against the budget instead.
    growing = {chat: _growing(seen[chat]) for chat in CHATS}
    assert all(len(own) >= 3 for own in growing.values()), {chat: len(own) for chat, own in growing.items()}
    for chat, own in growing.items():  # each chat: never two writes closer than the setting
        assert min(_gaps(own)) >= INTERVAL_SECONDS - LAG_SECONDS, (chat, _gaps(own))
    # While all 20 stream, each one's interval is stretched to 20 / STREAM_EDITS_PER_SECOND. Its turn for a write
    # that reached the fake at t came between t - LAG_SECONDS and t: all 20 had opened by then if t is past every
    # chat's first write by the lag, and none had closed if t is before every chat's last write of less than its
    # whole answer (its model still streaming) by the lag.
    all_open = max(own[0].at for own in growing.values()) + OPEN_LAG_SECONDS
    none_done = min(max(w.at for w in own if _answer_for(n) not in w.text) for n, own in enumerate(growing.values()))
    stretched = [
        b.at - a.at
        for own in growing.values()
        for a, b in itertools.pairwise(own)
        if all_open <= a.at <= none_done - OPEN_LAG_SECONDS
    ]
    assert len(stretched) >= len(CHATS) // 2, stretched
    assert min(stretched) >= len(CHATS) / EDITS_PER_SECOND - LAG_SECONDS, stretched
    # All chats together: a window of BUDGET_WINDOW_SECONDS holds the turns of that window and the lag before it,
    # at most STREAM_EDITS_PER_SECOND a second (and one more at its edge); the 20 chats unpaced, one write per
    # INTERVAL_SECONDS each, would put twice that in it.
    busiest = _busiest([w.at for own in growing.values() for w in own], BUDGET_WINDOW_SECONDS)
    most = EDITS_PER_SECOND * (BUDGET_WINDOW_SECONDS + LAG_SECONDS) + 1
    wished = len(CHATS) * BUDGET_WINDOW_SECONDS / INTERVAL_SECONDS
    assert most < wished
    assert EDITS_PER_SECOND * BUDGET_WINDOW_SECONDS / 2 <= busiest <= most  # the budget, not the chats' wish, held them


BEFORE = "Sure, I will set up a daily post of the stand-up notes for this group. One moment while I book it."
AFTER = "Done: every morning the notes will be posted here. Tell me if you would like another time."


async def test_a_tool_call_mid_answer_keeps_the_text_before_it_and_shows_what_it_started(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.03)  # BEFORE in about 0.7 s: written in a few steps
    async with streaming_bot(tmp_path, pace, STREAM_EDIT_INTERVAL_SECONDS=INTERVAL_SECONDS) as (app, tg, llm):
        llm.openai.handle_with(_ToolMidAnswer(tg))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} post the stand-up notes every day", first_name="Ann")
        await llm.wait_for_requests(2)
        await tg.wait_until(lambda: (shown(tg) and AFTER in shown(tg)[0] and not shown(tg)[0].endswith("…")) or None)
        await app.wait_quiet(GROUP_ID)
        [(stored, kind)] = await stored_answers(app)
        before, note, after = stored.split("\n\n")
        assert (before, after, kind) == (BEFORE, AFTER, "reply")
        assert note.startswith(f"{NOTE_MARK}Scheduled task ") and "every 1 day" in note
        final = f"Crew: {stored}"
        [message] = tg.sent_messages(GROUP_ID)
        assert shown(tg) == [final] and final.count(BEFORE) == final.count(AFTER) == 1
        seen = writes(tg)
        assert [w.message_id for w in seen] == [message.message_id] * len(seen)
        # The message only ever grew: every write is the start of the final text, so nothing shown went away.
        growing = _growing(seen)
        assert all(final.startswith(w.text.removesuffix(WRITING_MARK)) for w in growing), [w.text for w in seen]
        texts = [w.text for w in growing]
        assert any(t.startswith("Crew: Sure") and BEFORE not in t for t in texts)  # it grew before the tool call
        assert f"Crew: {BEFORE}\n\n{note}{WRITING_MARK}" in texts  # what it started, while it went on
        assert seen[-1].text == final and [w.text for w in seen].count(final) == 1


class _ToolMidAnswer:
    """The model writes BEFORE and calls schedule_task (no Docker: the task posts a message), then, once the chat
    shows what the tool started, writes AFTER."""

    def __init__(self, tg: FakeTelegram) -> None:
        self._tg = tg
        self._calls = 0

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self._calls += 1
        if self._calls == 1:
            task = {"prompt": "Post the stand-up notes.", "schedule": "every 1d", "mode": "message"}
            return openai_tool_call("schedule_task", task, text=BEFORE)
        await self._tg.wait_until(lambda: [w for w in writes(self._tg) if NOTE_MARK in w.text] or None)
        return openai_text(AFTER)


async def test_a_model_streaming_one_character_at_a_time_is_edited_as_the_interval_allows(tmp_path: Path) -> None:
    answer = "One character at a time, for a long while, the model writes this answer. " * 12  # some 900
    pace = StreamPace(piece_chars=1, seconds_per_piece=0.004)  # about 250 chunks a second: some 4 s
    async with streaming_bot(tmp_path, pace, STREAM_EDIT_INTERVAL_SECONDS=INTERVAL_SECONDS) as (app, tg, llm):
        llm.openai.enqueue(openai_text(answer))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} write slowly")
        [request] = await llm.wait_for_requests(1)
        await tg.wait_until(lambda: shown(tg) == [f"Crew: {answer.strip()}"] or None, timeout_seconds=15)
        await app.wait_quiet(GROUP_ID)
        seen = writes(tg)
        growing = _growing(seen)
        streamed_seconds = seen[-1].at - request.at  # the final text is written when the stream has ended
        assert streamed_seconds >= len(answer) * pace.seconds_per_piece  # it was long: not written at once
        # One write per interval at most (plus the first), not one per chunk.
        assert 3 <= len(growing) <= streamed_seconds / INTERVAL_SECONDS + 1, len(growing)
        assert min(_gaps(growing)) >= INTERVAL_SECONDS - STEADY_LAG_SECONDS, _gaps(growing)
        assert len(tg.sent_messages(GROUP_ID)) == 1
        assert [w.text for w in seen].count(f"Crew: {answer.strip()}") == 1
        assert await stored_answers(app) == [(answer.strip(), "reply")]
