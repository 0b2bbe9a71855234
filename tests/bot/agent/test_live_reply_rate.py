"""A group's flood limit counts edits: a long answer streamed into a group that Telegram (the fake Bot API)
holds to a few writes per window meets one 429, slows down for that chat, and meets no other."""

from __future__ import annotations

from pathlib import Path

from tests.bot.agent.stream_rig import shown, streaming_bot, writes
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

# The fake's limit of the group: scaled down from Telegram's 20 a minute so the test takes seconds. At the
# interval the bot starts with (1 s, the setting's least) the third write in 3 s is over it.
MAX_WRITES, WINDOW_SECONDS = 2, 3.0
ANSWER = " ".join(f"word{n}" for n in range(160))  # about 1,100 characters


async def test_a_long_answer_in_a_group_slows_down_at_its_first_429_and_meets_no_storm(tmp_path: Path) -> None:
    pace = StreamPace(piece_chars=10, seconds_per_piece=0.08)  # about 9 s of text
    async with streaming_bot(tmp_path, pace) as (app, tg, llm):
        tg.limit_group_writes(MAX_WRITES, WINDOW_SECONDS)
        llm.openai.enqueue(openai_text(ANSWER))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} tell me everything")
        await llm.wait_for_requests(1)
        await app.wait_quiet(GROUP_ID)
        growing = [w for w in writes(tg) if w.text.endswith(" …")]
        refused = [r for r in tg.rate_refusals(GROUP_ID) if r.at <= growing[-1].at]
        assert len(refused) == 1, refused  # the first 429 doubles the chat's interval: no cycle of them
        assert len(growing) >= 4, growing  # still shown as it grows, every 2 s
        final = [f"Crew: {ANSWER}"]  # the final text lands whole (the outbox waits out a 429 of its own)
        assert await tg.wait_until(lambda: True if shown(tg) == final else None)
