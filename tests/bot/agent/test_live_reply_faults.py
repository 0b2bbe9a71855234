"""Streamed answers when things go wrong or change: a merge mid-stream, a provider failing mid-stream, a stream
that ends without its final chunk, 429s, a message deleted while written; and private chats' drafts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.bot.agent.stream_rig import shown, stored_answers, streaming_bot
from tests.fakes.faults import Fault
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

PRIVATE_ID = 4242
SLOW = StreamPace(piece_chars=4, seconds_per_piece=0.05)
LONG_FIRST = "This first answer is long and slow, and nobody should see its end. " * 4


class Answers:
    """The n-th model request is answered with the n-th text."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return openai_text(self.texts[min(self.calls, len(self.texts)) - 1])


async def test_a_merging_follow_up_stops_the_stream_and_the_merged_answer_is_written_into_it(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW, MERGE_WINDOW_SECONDS=30) as (app, tg, llm):
        llm.openai.handle_with(Answers(LONG_FIRST, "One answer to both."))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} first", first_name="Ann")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)  # the first words of the first answer
        tg.push_message(GROUP_ID, f"@{tg.bot_username} and second", first_name="Ann")
        await llm.wait_for_disconnects(1)  # the first stream was closed
        await tg.wait_until(lambda: shown(tg) == ["Crew: One answer to both."] or None)
        await app.wait_quiet(GROUP_ID)
        assert [m.message_id for m in tg.sent_messages(GROUP_ID)] == [live.message_id]  # never two answers
        assert await stored_answers(app) == [("One answer to both.", "reply")]
        # The first turn's record of the message went to the merged turn, and ended with its final text.
        assert await app.stores.live.leftovers() == []


async def test_a_merged_answer_shorter_than_the_aborted_one_leaves_no_stale_part(tmp_path: Path) -> None:
    long_first = "\n".join(f"Line {n}: " + "words " * 12 for n in range(200))  # about 15,000 characters
    pace = StreamPace(piece_chars=150, seconds_per_piece=0.05)  # about 5 s for the whole of it
    async with streaming_bot(tmp_path, pace, MERGE_WINDOW_SECONDS=30) as (app, tg, llm):
        llm.openai.handle_with(Answers(long_first, "One short answer to both."))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} first")
        first, second = await tg.wait_for_messages(GROUP_ID, 2, timeout_seconds=10)  # two parts on screen
        tg.push_message(GROUP_ID, f"@{tg.bot_username} and second")
        await llm.wait_for_disconnects(1)
        await tg.wait_until(lambda: shown(tg) == ["Crew: One short answer to both."] or None)
        await app.wait_quiet(GROUP_ID)
        assert tg.message(GROUP_ID, first.message_id) is not None  # the answer went into the first part
        assert tg.message(GROUP_ID, second.message_id) is None  # the part it no longer needs was deleted
        assert len(tg.sent_messages(GROUP_ID)) == 2  # and nothing was sent anew
        assert await stored_answers(app) == [("One short answer to both.", "reply")]


async def test_a_provider_error_mid_stream_keeps_the_text_and_says_it_was_cut(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.02, cut_after=10, error_after_cut=True)
    async with streaming_bot(tmp_path, pace) as (app, tg, llm):
        llm.openai.handle_with(Answers(LONG_FIRST))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} go")
        await llm.wait_for_requests(1)
        await tg.wait_until(lambda: [t for t in shown(tg) if "could not answer" in t] or None)
        await app.wait_quiet(GROUP_ID)
        [final] = shown(tg)
        assert final.startswith("Crew: This first answer") and final.endswith(")")
        assert len(tg.sent_messages(GROUP_ID)) == 1
        [(content, kind)] = await stored_answers(app)
        assert kind == "notice" and content.startswith("This first answer")


async def test_a_stream_ending_without_its_final_chunk_ends_the_answer_with_what_came(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.01, cut_after=6)
    async with streaming_bot(tmp_path, pace) as (app, tg, llm):
        llm.openai.handle_with(Answers("Short answer that is cut off somewhere."))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} go")
        await llm.wait_for_requests(1)
        await app.wait_quiet(GROUP_ID)
        [final] = shown(tg)
        assert final.startswith("Crew: Short answer") and not final.endswith("…")
        assert len(await stored_answers(app)) == 1


async def test_429s_and_a_deleted_message_lose_nothing_of_the_final_text(tmp_path: Path) -> None:
    async with streaming_bot(tmp_path, SLOW) as (app, tg, llm):
        answer = "Every word of this answer arrives in the end, whatever Telegram says meanwhile."
        llm.openai.handle_with(Answers(answer))
        tg.fail_next("editMessageText", Fault.retry_after(1), count=2)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} go")
        [live] = await tg.wait_for_messages(GROUP_ID, 1)
        tg.delete_message(GROUP_ID, live.message_id)  # a member (an admin) deleted it mid-stream
        await tg.wait_until(lambda: shown(tg) == [f"Crew: {answer}"] or None, timeout_seconds=10)
        assert await stored_answers(app) == [(answer, "reply")]


async def test_a_private_chat_sees_a_draft_then_the_final_message(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.03)
    async with streaming_bot(tmp_path, pace, ALLOWED_CHAT_IDS=f"{GROUP_ID},{PRIVATE_ID}") as (app, tg, llm):
        answer = "A private answer, written into a draft while it grows, then sent."
        llm.openai.handle_with(Answers(answer))
        tg.push_message(PRIVATE_ID, "hello there")
        await tg.wait_until(lambda: tg.drafts(PRIVATE_ID) or None)
        [sent] = await tg.wait_for_messages(PRIVATE_ID, 1)
        await app.wait_quiet(PRIVATE_ID)
        drafts = tg.drafts(PRIVATE_ID)
        assert drafts[0].plain_text.startswith("Crew: A") and drafts[0].plain_text.endswith("…")
        assert drafts[0].at < sent.at and len({d.draft_id for d in drafts}) == 1
        assert sent.plain_text == f"Crew: {answer}"
        assert tg.edits(PRIVATE_ID) == []
        assert await stored_answers(app, PRIVATE_ID) == [(answer, "reply")]
