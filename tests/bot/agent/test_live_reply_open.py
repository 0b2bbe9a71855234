"""A merged turn's message kept for the chat's next turn, when that turn is cancelled (a merge, a Stop, the bot
stopping) while it takes the message over: the message stays kept, its record with it, for the turn after."""

from __future__ import annotations

import asyncio

import pytest

from bot.agent.live_reply import LiveReplies
from bot.channels.edit_pacer import EditPacer
from core.store import ChatStore, Database
from core.store.live_messages import LiveMessageStore
from core.typing_indicator import TypingIndicator
from tests.bot.agent.test_live_restart import Unseen
from tests.bot.helpers import RecordingChannel

CHAT = -1001


class Gate:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    async def passing(self) -> None:
        self.entered.set()
        await self.go.wait()


class GatedRecords(LiveMessageStore):
    """The real store, its hand-over held until the test lets it go."""

    def __init__(self, db: Database, gate: Gate) -> None:
        super().__init__(db)
        self.gate = gate

    async def hand_over(self, from_turn: str, to_turn: str, trigger_message_id: int | None) -> bool:
        await self.gate.passing()
        return await super().hand_over(from_turn, to_turn, trigger_message_id)


class GatedChannel(Unseen):
    """Asked whether the chat shows drafts, it answers when the test lets it."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def drafts_for(self, chat_id: int) -> bool:
        await self.gate.passing()
        return False


@pytest.mark.parametrize("handed_over", [False, True])
async def test_a_cancel_while_a_kept_message_is_taken_over_keeps_it_for_the_next_turn(
    db: Database, chats: ChatStore, handed_over: bool
) -> None:
    await chats.ensure(CHAT, "supergroup", "a group")
    # Cancelled during the record's hand-over, or after it (the record already the cancelled turn's).
    hand_over, drafts = Gate(), Gate()
    (hand_over if handed_over else drafts).go.set()  # the other step passes at once
    records = GatedRecords(db, hand_over)
    await records.save("t-merged", CHAT, None, (11, 12), "half an answer")
    typing = TypingIndicator(RecordingChannel().send_typing, 4.0)
    live = LiveReplies(GatedChannel(drafts), EditPacer(1.0, 20.0), typing, "Crew", records=records)
    live.keep(CHAT, (11, 12), "t-merged")

    opening = asyncio.create_task(live.open(CHAT, "t-cut", None))
    await (drafts if handed_over else hand_over).entered.wait()
    opening.cancel()
    hand_over.go.set()
    drafts.go.set()
    with pytest.raises(asyncio.CancelledError):
        await opening

    assert live.kept(CHAT)
    reply = await live.open(CHAT, "t-next", None)
    assert await reply.settle() == (11, 12)  # the next answer is written into the same message
    [record] = await records.leftovers()
    assert (record.turn_id, record.part_ids) == ("t-next", (11, 12))  # and owns its record: no orphan
