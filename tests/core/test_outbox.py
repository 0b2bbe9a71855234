"""The outbox: in order per chat, part by part, retried with backoff, given up only for good reasons."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from core.outbox import MAX_ATTEMPTS, DeliveryError, Outbox
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.outbox import OutboxStore, Outgoing
from tests.bot.helpers import RecordingChannel

CHAT = -777
# Long enough for a dispatcher polling every 50 ms to show it; one that sleeps until a due time reads 0 times.
BACKOFF_WINDOW_SECONDS = 0.5
SETTLE_SECONDS = 0.2  # lets the wake-ups the setup causes run their course before counting


class FlakyChannel(RecordingChannel):
    """Splits on '|' into parts; fails the send calls listed in `failures` (by call number)."""

    def __init__(self, failures: dict[int, DeliveryError]) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    def split(self, text: str) -> list[str]:
        return text.split("|")

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        self.calls += 1
        if self.calls in self.failures:
            self.changed()
            raise self.failures[self.calls]
        return await super().send_part(chat_id, part)


class Clock:
    def __init__(self) -> None:
        self.now = time.time() + 1.0  # rows are staged with the real time: they are due at once

    def __call__(self) -> float:
        return self.now


def outgoing(text: str) -> Outgoing:
    return Outgoing(NewMessage(chat_id=CHAT, sender_name="Crew", content=text, is_bot=True), f"Crew: {text}")


@pytest.fixture
async def store(db: Database) -> OutboxStore:
    await ChatStore(db).ensure(CHAT, "group", "outbox")
    return OutboxStore(db)


async def test_message_and_outbox_row_are_stored_together(store: OutboxStore, messages: MessageStore) -> None:
    channel = FlakyChannel({})
    outbox = Outbox(store, channel)
    await store.add(outgoing("hello"))
    assert [m.content for m in await messages.recent(CHAT, 5)] == ["hello"]
    assert await outbox.flush(CHAT)
    assert channel.sent == [(CHAT, "Crew: hello")]
    assert await store.counts() == {"sent": 1}
    assert await outbox.flush(CHAT)  # nothing owed any more: nothing sent twice
    assert len(channel.sent) == 1


async def test_transient_failure_resumes_at_the_failed_part_and_keeps_order(store: OutboxStore) -> None:
    clock = Clock()
    channel = FlakyChannel({2: DeliveryError("flood", permanent=False, retry_after_seconds=7)})
    outbox = Outbox(store, channel, clock=clock)
    await store.add(outgoing("a1|a2|a3"))
    await store.add(outgoing("b1"))
    assert not await outbox.flush(CHAT)
    assert channel.sent == [(CHAT, "Crew: a1")]
    first, second = await store.pending(CHAT)
    assert second.parts_sent == 0
    assert first.parts_sent == 1 and first.attempts == 1
    assert first.next_attempt_at == clock.now + 7  # Telegram's retry_after is honoured
    clock.now += 3
    assert not await outbox.flush(CHAT)  # not due yet: the later message does not overtake it
    assert len(channel.sent) == 1
    clock.now += 5
    assert await outbox.flush(CHAT)
    assert [text for _, text in channel.sent] == ["Crew: a1", "a2", "a3", "Crew: b1"]


async def test_permanent_failure_is_recorded_and_later_messages_still_go(store: OutboxStore) -> None:
    channel = FlakyChannel({1: DeliveryError("Forbidden: bot was kicked", permanent=True)})
    outbox = Outbox(store, channel)
    await store.add(outgoing("lost"))
    await store.add(outgoing("next"))
    assert await outbox.flush(CHAT)
    assert await store.counts() == {"failed": 1, "sent": 1}
    assert channel.sent == [(CHAT, "Crew: next")]


async def test_an_unreachable_chat_gives_up_every_row_at_once_and_tells_the_owner(store: OutboxStore) -> None:
    channel = FlakyChannel({1: DeliveryError("Forbidden: bot was kicked", permanent=True, chat_unreachable=True)})
    told: list[tuple[int, str]] = []

    async def on_unreachable(chat_id: int, reason: str) -> None:
        told.append((chat_id, reason))

    outbox = Outbox(store, channel, on_unreachable=on_unreachable)
    for text in ("lost", "also lost", "and this"):
        await store.add(outgoing(text))
    assert not await outbox.flush(CHAT)
    assert channel.sent == []  # one attempt, no send of the later rows and no retries
    assert channel.calls == 1
    assert await store.counts() == {"failed": 3}
    assert told == [(CHAT, "Forbidden: bot was kicked")]
    assert await store.pending(CHAT) == []
    assert await store.errors() == ["undeliverable: Forbidden: bot was kicked"]

    await store.add(outgoing("after coming back"))  # the chat is not written off: the next message is tried
    assert await outbox.flush(CHAT)
    assert channel.sent == [(CHAT, "Crew: after coming back")]


async def test_removal_reported_by_the_platform_gives_up_what_is_owed(store: OutboxStore) -> None:
    channel = FlakyChannel({})
    told: list[int] = []

    async def on_unreachable(chat_id: int, reason: str) -> None:
        told.append(chat_id)

    outbox = Outbox(store, channel, on_unreachable=on_unreachable)
    await store.add(outgoing("never sent"))
    await outbox.chat_unreachable(CHAT, "the bot was removed from the chat")
    assert await outbox.flush(CHAT)
    assert channel.sent == [] and told == [CHAT]
    assert await store.counts() == {"failed": 1}


async def test_gives_up_after_max_attempts(store: OutboxStore) -> None:
    clock = Clock()
    failures = {n: DeliveryError("network down", permanent=False) for n in range(1, MAX_ATTEMPTS + 1)}
    outbox = Outbox(store, FlakyChannel(failures), clock=clock)
    await store.add(outgoing("doomed"))
    for _ in range(MAX_ATTEMPTS):
        clock.now += 10_000
        await outbox.flush(CHAT)
    assert await store.counts() == {"failed": 1}


async def test_what_a_crash_left_owed_is_sent_after_reopening(tmp_path: Path) -> None:
    path = tmp_path / "crash.sqlite3"
    db = await Database.open(path)
    await ChatStore(db).ensure(CHAT, "group", "outbox")
    await OutboxStore(db).add(outgoing("owed before the crash"))
    await db.close()  # the process dies before sending

    db = await Database.open(path)
    channel = FlakyChannel({})
    outbox = Outbox(OutboxStore(db), channel)
    outbox.start()
    await channel.wait_for(lambda: len(channel.sent) == 1)
    await outbox.close()
    assert channel.sent == [(CHAT, "Crew: owed before the crash")]
    await db.close()


class GatedChannel(RecordingChannel):
    """Sends wait until `gate` is set: a send in flight for as long as the test likes."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.in_flight = 0

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        self.in_flight += 1
        self.changed()
        await self.gate.wait()
        self.in_flight -= 1
        return await super().send_part(chat_id, part)


class ScanCounter:
    """Counts the statements that read the outbox table, as SQLite runs them (no wrapper around our code)."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, statement: str) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "outbox" in statement:
            self.reads += 1

    async def during(self, seconds: float) -> int:
        before = self.reads
        await asyncio.sleep(seconds)
        return self.reads - before


async def counting(db: Database) -> ScanCounter:
    counter = ScanCounter()
    await db.conn.set_trace_callback(counter)
    return counter


async def test_dispatcher_sleeps_while_the_chats_first_row_backs_off(db: Database, store: OutboxStore) -> None:
    channel = FlakyChannel({1: DeliveryError("flood", permanent=False, retry_after_seconds=60)})
    outbox = Outbox(store, channel)
    counter = await counting(db)
    await store.add(outgoing("first"))
    outbox.start()
    await channel.wait_for(lambda: channel.calls == 1)  # failed: retried in 60 s
    await store.add(outgoing("second"))  # due now, but it must not overtake the first
    outbox.flush_soon(CHAT)
    await asyncio.sleep(SETTLE_SECONDS)

    reads = await counter.during(BACKOFF_WINDOW_SECONDS)

    await outbox.close()
    assert channel.sent == []
    assert reads <= 1, f"the dispatcher read the outbox {reads} times during a back-off"


async def test_dispatcher_sleeps_while_a_due_chat_is_being_sent(db: Database, store: OutboxStore) -> None:
    channel = GatedChannel()
    outbox = Outbox(store, channel)
    counter = await counting(db)
    await store.add(outgoing("slow"))
    outbox.start()
    await channel.wait_for(lambda: channel.in_flight == 1)
    await asyncio.sleep(SETTLE_SECONDS)

    reads = await counter.during(BACKOFF_WINDOW_SECONDS)

    channel.gate.set()
    await channel.wait_for(lambda: len(channel.sent) == 1)
    await outbox.close()
    assert reads <= 1, f"the dispatcher read the outbox {reads} times while one send was in flight"


async def test_flushes_of_one_chat_go_one_at_a_time_and_leave_nothing_behind(store: OutboxStore) -> None:
    channel = GatedChannel()
    outbox = Outbox(store, channel)
    await store.add(outgoing("first"))
    first = asyncio.create_task(outbox.flush(CHAT))
    await channel.wait_for(lambda: channel.in_flight == 1)
    await store.add(outgoing("second"))
    second = asyncio.create_task(outbox.flush(CHAT))  # waits for the first: never two sends to a chat at once
    await asyncio.sleep(SETTLE_SECONDS)
    assert channel.in_flight == 1 and outbox.chats_in_flight() == 1

    channel.gate.set()
    assert await first and await second
    assert channel.sent == [(CHAT, "Crew: first"), (CHAT, "Crew: second")]
    assert outbox.chats_in_flight() == 0  # a chat that is not being sent to keeps no lock
