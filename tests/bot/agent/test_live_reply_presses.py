"""Presses on a growing answer at awkward moments: a Stop once the answer is complete and on its way, a Stop
by a member whose display name is Markdown, a forged Stop on a message with live buttons."""

from __future__ import annotations

from pathlib import Path

from core.store.turns import TurnStatus
from tests.bot.agent.stream_rig import shown, stored_answers, streaming_bot
from tests.bot.agent.test_live_reply_races import (
    ANSWER,
    ASKER,
    PACE,
    Answers,
    answered_in_full,
    nothing_left_running,
)
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

SLOW = StreamPace(piece_chars=4, seconds_per_piece=0.05)
PRIZE = "[Claim prize](https://evil.example)"


async def test_a_stop_once_the_answer_is_complete_says_so_and_stops_nothing(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, PACE) as (app, tg, llm):
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        turn = app.engine.current_turn(GROUP_ID)
        assert turn is not None
        tg.holds.hold("editMessageText", GROUP_ID)  # the button stays on screen until the held write lands
        await tg.wait_until(lambda: tg.holds.waiting("editMessageText", GROUP_ID) or None)
        await answered_in_full(app)
        [stop] = tg.buttons(GROUP_ID, live.message_id)
        pressed = tg.push_callback_query(GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER)
        answer = await tg.wait_for_answer(pressed)
        assert answer.text == "This answer is already complete: it is being sent." and not answer.show_alert
        tg.holds.release("editMessageText", GROUP_ID)
        await tg.wait_until(lambda: shown(tg) == [f"Crew: {ANSWER.strip()}"] or None)  # unmarked: not stopped
        await app.wait_quiet(GROUP_ID)
        assert await stored_answers(app) == [(ANSWER.strip(), "reply")]
        assert await app.stores.turns.status(turn.id) is TurnStatus.COMPLETED  # not aborted: no cascade ran
        nothing_left_running(app)


async def test_a_stoppers_markdown_name_is_shown_as_written_not_as_a_link(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name=PRIZE)
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        [stop] = tg.buttons(GROUP_ID, live.message_id)
        pressed = tg.push_callback_query(
            GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER, first_name=PRIZE
        )
        assert (await tg.wait_for_answer(pressed)).text == "Stopped."
        await tg.wait_until(lambda: [t for t in shown(tg) if t.endswith(f"(stopped by {PRIZE})")] or None)
        await app.wait_quiet(GROUP_ID)
        final = tg.requests("editMessageText")[-1].params
        assert "<a " not in str(final["text"]) and "evil.example" in str(final["text"])
        [(content, kind)] = await stored_answers(app)
        assert kind == "stopped" and "stopped by" in content


async def test_a_long_name_is_cut_in_the_mark(tmp_path: Path) -> None:
    name = "N" * 200
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        [stop] = tg.buttons(GROUP_ID, live.message_id)
        pressed = tg.push_callback_query(
            GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER, first_name=name
        )
        await tg.wait_for_answer(pressed)
        await tg.wait_until(lambda: [t for t in shown(tg) if t.endswith(f"(stopped by {'N' * 64})")] or None)
        await app.wait_quiet(GROUP_ID)


async def test_a_forged_stop_leaves_the_buttons_of_the_message_pressed(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        forged = tg.push_callback_query(GROUP_ID, live.message_id, "s:ffffffffffff", user_id=ASKER)
        answer = await tg.wait_for_answer(forged)
        assert answer.text == "This answer is not being written any more." and not answer.show_alert
        await app.wait_quiet(GROUP_ID)
        assert tg.requests("editMessageReplyMarkup") == []  # its live Stop button was never taken off
        assert await stored_answers(app) == [(ANSWER.strip(), "reply")]  # and the answer went on


async def test_the_old_stop_button_of_a_merged_answer_stops_the_turn_writing_into_it(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW, MERGE_WINDOW_SECONDS=30) as (app, tg, llm):
        llm.openai.handle_with(Answers(ANSWER, ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} first", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        [old_stop] = tg.buttons(GROUP_ID, live.message_id)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} and second", user_id=ASKER, first_name="Ann")
        await llm.wait_for_requests(2)  # the merged turn has taken the message over; its button is the old one
        pressed = tg.push_callback_query(
            GROUP_ID, live.message_id, old_stop["callback_data"], user_id=ASKER, first_name="Ann"
        )
        answer = await tg.wait_for_answer(pressed)
        assert answer.text == "Stopped." and not answer.show_alert
        await llm.wait_for_disconnects(2)  # the merged turn's stream was closed too
        await tg.wait_until(lambda: [t for t in shown(tg) if t.endswith("(stopped by Ann)")] or None)
        await app.wait_quiet(GROUP_ID)
        assert [m.message_id for m in tg.sent_messages(GROUP_ID)] == [live.message_id]
        assert tg.requests("editMessageReplyMarkup") == []
        [(_, kind)] = await stored_answers(app)
        assert kind == "stopped"
        assert await app.stores.live.leftovers() == []
