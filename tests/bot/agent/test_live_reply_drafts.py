"""A private chat whose drafts Telegram refuses (an older Bot API): the refusal is remembered after the first
one, no draft is tried again, and the chat's next answers grow by edits of a message as a group's do."""

from __future__ import annotations

from pathlib import Path

from tests.bot.agent.stream_rig import stored_answers, streaming_bot
from tests.fakes.faults import Fault
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

PRIVATE_ID = 4242
REFUSED = Fault.error(400, "Bad Request: method is available only for bots with forum topic mode enabled")
ANSWER = "A private answer that grows for a few seconds, word by word, until it is all written out here."


async def test_drafts_refused_once_are_not_tried_again_and_answers_grow_by_edits(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.1)  # about 2.5 s: several writes per answer
    async with streaming_bot(tmp_path, pace, ALLOWED_CHAT_IDS=f"{GROUP_ID},{PRIVATE_ID}") as (app, tg, llm):
        tg.fail_next("sendMessageDraft", REFUSED, count=100)
        llm.openai.handle_with(lambda body: openai_text(ANSWER))
        tg.push_message(PRIVATE_ID, "hello there")
        await tg.wait_for_messages(PRIVATE_ID, 1)
        await app.wait_quiet(PRIVATE_ID)
        assert tg.call_count("sendMessageDraft") == 1  # refused once, then not tried again
        tg.push_message(PRIVATE_ID, "and again")
        await tg.wait_for_messages(PRIVATE_ID, 2)
        await app.wait_quiet(PRIVATE_ID)
        assert tg.call_count("sendMessageDraft") == 1
        second = tg.sent_messages(PRIVATE_ID)[1]
        growing = [e for e in tg.edits(PRIVATE_ID) if e.message_id == second.message_id]
        assert second.plain_text.endswith(" …") and growing, growing  # sent with its first words, then edited
        assert tg.message(PRIVATE_ID, second.message_id)["text"] == f"Crew: {ANSWER}"  # type: ignore[index]
        assert await stored_answers(app, PRIVATE_ID) == [(ANSWER, "reply"), (ANSWER, "reply")]
