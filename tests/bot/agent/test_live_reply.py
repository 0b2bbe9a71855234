"""Streamed answers in a group: one message that grows, paced, valid HTML at every edit, the final text once."""

from __future__ import annotations

import itertools
from pathlib import Path

from tests.bot.agent.stream_rig import INTERVAL_SECONDS, shown, stored_answers, streaming_bot, writes
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

ANSWER = (
    "Here is the plan, step by step, so you can follow along while it is written. "
    "First we read the [docs](https://example.org/docs) and then we try it:\n\n"
    "```python\nfor n in range(3):\n    print(n)\n```\n\nThat is **all** there is to it, really."
)


async def test_the_answer_grows_in_one_message_and_ends_as_the_final_text(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.02)  # about 1.5 s for the whole answer
    async with streaming_bot(tmp_path, pace) as (app, tg, llm):
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} how do I do it?", first_name="Ann")
        await tg.wait_for_messages(GROUP_ID, 1)
        first_at = tg.sent_messages(GROUP_ID)[0].at
        [request] = await llm.wait_for_requests(1)
        await app.wait_quiet(GROUP_ID)
        seen = writes(tg)
        assert len(tg.sent_messages(GROUP_ID)) == 1  # one message, edited as it grew
        assert len(seen) >= 3, seen  # first words, at least one edit while written, the final text
        assert seen[0].text.startswith("Crew: ") and seen[0].text.endswith(" …")
        assert len(seen[0].text) < len(ANSWER) // 2  # sent when the first words were there, not at the end
        assert first_at - request.at < 1.0
        final = shown(tg)[0]
        assert final.startswith("Crew: Here is the plan") and final.endswith("really.") and "…" not in final
        assert "[docs]" not in final and "**" not in final  # rendered, not raw Markdown
        # Every write was accepted as HTML (the fake refuses unbalanced tags), half a code fence included.
        assert all(e.parse_mode == "HTML" for e in tg.edits(GROUP_ID))
        assert tg.sent_messages(GROUP_ID)[0].parse_mode == "HTML"
        gaps = [b.at - a.at for a, b in itertools.pairwise(seen)]
        assert min(gaps[:-1], default=INTERVAL_SECONDS) >= INTERVAL_SECONDS * 0.95  # paced; the final goes at once
        assert await stored_answers(app) == [(ANSWER, "reply")]  # stored once, the final text
        assert await app.stores.live.leftovers() == []  # its record ended with the final text's outbox row


async def test_an_answer_past_the_limit_goes_on_in_a_next_message(tmp_path: Path) -> None:
    long_answer = "\n".join(f"Line {n}: " + "words " * 12 for n in range(120))  # about 9,000 characters
    pace = StreamPace(piece_chars=300, seconds_per_piece=0.02)
    async with streaming_bot(tmp_path, pace) as (app, tg, llm):
        llm.openai.enqueue(openai_text(long_answer))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} write a lot")
        await llm.wait_for_requests(1)
        await app.wait_quiet(GROUP_ID)
        parts = shown(tg)
        assert len(parts) == 3  # every part at most 4,096 characters
        assert all(len(part) <= 4096 for part in parts)
        assert "".join(p.removeprefix("Crew: ") + "\n" for p in parts).split() == long_answer.split()
        assert not any(p.endswith("…") for p in parts)
        assert await stored_answers(app) == [(long_answer.strip(), "reply")]  # as a whole answer is stored


async def test_streaming_off_sends_the_whole_answer_once(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=4, seconds_per_piece=0.01)
    async with streaming_bot(tmp_path, pace, STREAM_REPLIES="false") as (app, tg, llm):
        llm.openai.enqueue(openai_text("a whole answer"))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} hi")
        [sent] = await tg.wait_for_messages(GROUP_ID, 1)
        await app.wait_quiet(GROUP_ID)
        assert sent.plain_text == "Crew: a whole answer"
        assert tg.edits(GROUP_ID) == []
