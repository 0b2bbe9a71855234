"""A streamed answer's outbox row (edit_ids): its parts are written into the messages that showed it, and the
messages past its last part are deleted before it counts as sent; a transient failure of a delete retries
the row (the parts rewritten as they are), a refusal leaves that message and the answer still counts as sent."""

from __future__ import annotations

import dataclasses

from core.outbox import DeliveryError, Outbox
from core.store.outbox import OutboxStore
from tests.core.test_outbox import CHAT, Clock, FlakyChannel, outgoing, store  # noqa: F401  (the fixture)


class EditingChannel(FlakyChannel):
    """Also a PartEditor: records edits and deletes; the n-th delete fails with `delete_failures[n]`."""

    def __init__(self, delete_failures: dict[int, DeliveryError]) -> None:
        super().__init__({})
        self.edited: list[tuple[int, str]] = []
        self.deleted: list[int] = []
        self.delete_failures = delete_failures
        self.deletes = 0

    async def edit_part(self, chat_id: int, message_id: int, part: str) -> None:
        self.edited.append((message_id, part))

    async def delete_part(self, chat_id: int, message_id: int) -> None:
        self.deletes += 1
        if self.deletes in self.delete_failures:
            raise self.delete_failures[self.deletes]
        self.deleted.append(message_id)


async def test_the_parts_an_answer_no_longer_needs_are_deleted_and_a_transient_failure_retries(
    store: OutboxStore,  # noqa: F811  (the imported fixture)
) -> None:
    clock = Clock()
    channel = EditingChannel({1: DeliveryError("flood", permanent=False, retry_after_seconds=3)})
    outbox = Outbox(store, channel, clock=clock)
    await store.add(dataclasses.replace(outgoing("short|answer"), edit_ids=(10, 11, 12, 13)))
    assert not await outbox.flush(CHAT)  # the first delete failed for now: the row waits
    [row] = await store.pending(CHAT)
    assert row.parts_sent == 1 and channel.deleted == []
    clock.now += 4
    assert await outbox.flush(CHAT)
    assert channel.edited == [(10, "Crew: short"), (11, "answer"), (11, "answer")]  # rewritten as it was
    assert channel.deleted == [12, 13]
    assert channel.sent == []  # nothing sent anew
    assert await store.counts() == {"sent": 1}


async def test_a_part_that_cannot_be_deleted_stays_and_the_answer_counts_as_sent(
    store: OutboxStore,  # noqa: F811  (the imported fixture)
) -> None:
    channel = EditingChannel({1: DeliveryError("message can't be deleted", permanent=True)})
    outbox = Outbox(store, channel)
    await store.add(dataclasses.replace(outgoing("short"), edit_ids=(10, 11, 12)))
    assert await outbox.flush(CHAT)
    assert channel.edited == [(10, "Crew: short")]
    assert channel.deleted == [12]  # the refused one (11) stays; the next is still deleted
    assert await store.counts() == {"sent": 1}
