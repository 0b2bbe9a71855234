"""Streamed answers when a Stop, a merge or an answer of its own lands at an awkward moment: while the last
write of a complete answer is on its way, or an answer that is only the skip marker. The chat keeps one
message with the whole answer, stored once, and nothing of the stream is left running."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.store.spend import SpendStore
from crewbot.app import App
from tests.bot.agent.stream_rig import shown, stored_answers, streaming_bot
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

ASKER = 1001
PACE = StreamPace(piece_chars=4, seconds_per_piece=0.02)
# About 3 s to stream, several STREAM_EDIT_INTERVAL_SECONDS: a write of the growing answer is held mid-stream.
ANSWER = "An answer written in full before anyone presses anything, every word of it kept. " * 8
POLL_SECONDS = 0.02


class Answers:
    """The n-th model request is answered with the n-th text."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return openai_text(self.texts[min(self.calls, len(self.texts)) - 1])


async def answered_in_full(app: App, requests: int = 1, timeout_seconds: float = 10.0) -> None:
    """Until the model's streams have all come in whole: each request's spend settled from the provider's
    count (a stream cut short is counted estimated), so the turn has gone on to end its writing."""

    async def whole() -> bool:
        rows = await SpendStore(app.stores.db).rows("0000-00-00", GROUP_ID)
        return sum(r.spend.calls - r.spend.estimated_calls for r in rows) >= requests

    async with asyncio.timeout(timeout_seconds):
        while True:  # the store has no change events
            if await whole():
                return
            await asyncio.sleep(POLL_SECONDS)


async def until(check: Callable[[], bool], timeout_seconds: float = 10.0) -> None:
    async with asyncio.timeout(timeout_seconds):
        while True:  # the engine has no change events
            if check():
                return
            await asyncio.sleep(POLL_SECONDS)


def nothing_left_running(app: App) -> None:
    assert app.live is not None
    assert app.live.pacer.streaming() == 0  # no writer holds a place among the chats streaming
    assert not app.typing.muted(GROUP_ID)  # typing shows again for the chat's next turn
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("live-")]  # no writer left


async def test_a_stop_while_the_last_write_is_on_its_way_keeps_the_whole_answer(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, PACE) as (app, tg, llm):
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        tg.holds.hold("editMessageText", GROUP_ID)  # Telegram slow: the next write of the growing answer waits
        await tg.wait_until(lambda: tg.holds.waiting("editMessageText", GROUP_ID) or None)
        assert llm.requests() and not tg.edits(GROUP_ID)  # held mid-stream, not the final text
        await answered_in_full(app)  # the turn now waits for that write before the final text goes out
        [stop] = tg.buttons(GROUP_ID, live.message_id)
        pressed = tg.push_callback_query(GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER)
        await tg.wait_for_answer(pressed)
        tg.holds.release("editMessageText", GROUP_ID)
        await tg.wait_until(lambda: shown(tg) == [f"Crew: {ANSWER.strip()}"] or None)
        await app.wait_quiet(GROUP_ID)
        assert [m.message_id for m in tg.sent_messages(GROUP_ID)] == [live.message_id]
        assert tg.buttons(GROUP_ID, live.message_id) == []
        assert await stored_answers(app) == [(ANSWER.strip(), "reply")]
        assert await app.stores.live.leftovers() == []
        nothing_left_running(app)


async def test_a_follow_up_while_the_last_write_is_on_its_way_gets_an_answer_of_its_own(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, PACE, MERGE_WINDOW_SECONDS=30) as (app, tg, llm):
        llm.openai.handle_with(Answers(ANSWER, "The second answer."))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        tg.holds.hold("editMessageText", GROUP_ID)
        await tg.wait_until(lambda: tg.holds.waiting("editMessageText", GROUP_ID) or None)
        await answered_in_full(app)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} and another thing", user_id=ASKER, first_name="Ann")
        await until(lambda: app.engine.waiting(GROUP_ID))  # the engine was told of it
        turn = app.engine.current_turn(GROUP_ID)
        assert turn is not None and not turn.aborted  # complete: not merged away
        tg.holds.release("editMessageText", GROUP_ID)
        await tg.wait_until(lambda: shown(tg) == [f"Crew: {ANSWER.strip()}", "Crew: The second answer."] or None)
        await app.wait_quiet(GROUP_ID)
        first, _ = tg.sent_messages(GROUP_ID)
        assert first.message_id == live.message_id
        assert await stored_answers(app) == [(ANSWER.strip(), "reply"), ("The second answer.", "reply")]
        assert await app.stores.live.leftovers() == []
        nothing_left_running(app)


async def test_an_answer_of_only_the_skip_marker_is_still_finished(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, PACE) as (app, tg, llm):
        llm.openai.enqueue(openai_text("[skip]"))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} answer exactly [skip]", user_id=ASKER)
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        await app.wait_quiet(GROUP_ID)
        # A member asked: the answer is given, and its message is finished (no "…", no Stop).
        await tg.wait_until(lambda: shown(tg) == ["Crew: [skip]"] or None)
        assert tg.buttons(GROUP_ID, live.message_id) == []
        assert await stored_answers(app) == [("[skip]", "reply")]
        assert await app.stores.live.leftovers() == []
        nothing_left_running(app)


async def test_a_merge_into_an_announcement_turn_writes_its_answer_into_the_kept_message(tmp_path: Path) -> None:
    slow = StreamPace(piece_chars=4, seconds_per_piece=0.05)
    async with streaming_bot(tmp_path, slow, MERGE_WINDOW_SECONDS=30) as (app, tg, llm):
        llm.openai.handle_with(Answers(ANSWER, "One answer to both.", "A later answer."))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} first", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        app.engine.notify(GROUP_ID, None, merge=False)  # a subagent's result to announce waits: no trigger bound
        tg.push_message(GROUP_ID, f"@{tg.bot_username} and second", user_id=ASKER, first_name="Ann")
        await llm.wait_for_disconnects(1)  # merged: the first stream was closed
        await tg.wait_until(lambda: shown(tg) == ["Crew: One answer to both."] or None)
        await app.wait_quiet(GROUP_ID)
        assert [m.message_id for m in tg.sent_messages(GROUP_ID)] == [live.message_id]
        assert tg.buttons(GROUP_ID, live.message_id) == []  # finished: no Stop left on it
        assert app.live is not None and not app.live.kept(GROUP_ID)

        tg.push_message(GROUP_ID, f"@{tg.bot_username} third", user_id=ASKER, first_name="Ann")
        await tg.wait_until(lambda: shown(tg) == ["Crew: One answer to both.", "Crew: A later answer."] or None)
        await app.wait_quiet(GROUP_ID)
        assert await stored_answers(app) == [("One answer to both.", "reply"), ("A later answer.", "reply")]
        assert await app.stores.live.leftovers() == []
        nothing_left_running(app)
