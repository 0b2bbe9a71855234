"""The Stop button on a growing answer: the asker (or an admin) stops the model call at once and the text so
far stays, marked as stopped and by whom; anyone else gets an alert; a second press, a press on a finished
answer and forged data do nothing."""

from __future__ import annotations

from pathlib import Path

from core.allowances import tokens_of_bytes
from core.store.spend import SpendStore
from tests.bot.agent.stream_rig import shown, stored_answers, streaming_bot
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

ASKER, STRANGER = 1001, 2002
SLOW = StreamPace(piece_chars=4, seconds_per_piece=0.05)
LONG = "An answer that goes the wrong way for a long while, until someone stops it. " * 6


async def test_the_asker_stops_the_answer_and_the_model_call_closes(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        llm.openai.enqueue(openai_text(LONG))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        [stop] = tg.buttons(GROUP_ID, live.message_id)
        assert stop["callback_data"].startswith("s:")

        refused = tg.push_callback_query(GROUP_ID, live.message_id, stop["callback_data"], user_id=STRANGER)
        alert = await tg.wait_for_answer(refused)
        assert alert.show_alert and alert.text is not None and "Ann" in alert.text

        pressed = tg.push_callback_query(
            GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER, first_name="Ann"
        )
        assert (await tg.wait_for_answer(pressed)).text == "Stopped."
        await llm.wait_for_disconnects(1)  # the provider's stream was closed
        await tg.wait_until(lambda: [t for t in shown(tg) if t.endswith("(stopped by Ann)")] or None)
        await app.wait_quiet(GROUP_ID)
        [final] = shown(tg)
        assert final.startswith("Crew: An") and len(final) < len(LONG)
        assert tg.buttons(GROUP_ID, live.message_id) == []  # the final text has no Stop any more
        [(content, kind)] = await stored_answers(app)
        assert kind == "stopped" and content.endswith("_(stopped by Ann)_")
        assert await app.stores.live.leftovers() == []  # ended with the stopped text: a restart leaves it be

        again = tg.push_callback_query(GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER)
        late = await tg.wait_for_answer(again)
        assert late.show_alert and late.text == "This answer is not being written any more."
        assert len(tg.sent_messages(GROUP_ID)) == 1


async def test_forged_and_other_chats_stop_buttons_do_nothing(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        llm.openai.enqueue(openai_text("A short answer."))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} hi", user_id=ASKER)
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        await app.wait_quiet(GROUP_ID)
        for data in ("s:ffffffffffff", "s:../../etc", "s:" + "a" * 80, "x:1"):
            query = tg.push_callback_query(GROUP_ID, live.message_id, data, user_id=ASKER)
            answer = await tg.wait_for_answer(query)
            assert not answer.show_alert and answer.text is not None
        assert shown(tg) == ["Crew: A short answer."]
        assert await stored_answers(app) == [("A short answer.", "reply")]


async def test_a_stopped_streams_output_so_far_counts_in_the_allowances(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        llm.openai.enqueue(openai_text(LONG))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} explain", user_id=ASKER, first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        await tg.wait_until(lambda: tg.edits(GROUP_ID) or None)  # a good part of the answer has streamed
        [stop] = tg.buttons(GROUP_ID, live.message_id)
        pressed = tg.push_callback_query(GROUP_ID, live.message_id, stop["callback_data"], user_id=ASKER)
        assert (await tg.wait_for_answer(pressed)).text == "Stopped."
        await llm.wait_for_disconnects(1)
        await app.wait_quiet(GROUP_ID)
        [(content, _)] = await stored_answers(app)
        streamed = content.removesuffix("\n\n_(stopped by Ann)_")
        [row] = await SpendStore(app.stores.db).rows("0000-00-00", GROUP_ID)
        assert (row.spend.calls, row.spend.estimated_calls) == (1, 1)
        # The provider sent no count before the stop (its usage comes last): the text so far, by the estimate.
        assert tokens_of_bytes(len(streamed.encode())) <= row.spend.output_tokens < tokens_of_bytes(len(LONG))
        assert row.spend.input_tokens > 0
