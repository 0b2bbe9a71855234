"""The spawn pre-check: a chat is told at once when the caps are full, instead of "started" then "refused"."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bot.agent.main_agent import MainAgent
from bot.agent.offline import offline_main_model
from bot.agent.spawn_guard import PICKUP_GRACE_SECONDS, CapCheckedSpawner
from bot.turns.engine import Turn
from core.store import ChatStore, MessageStore, NewMessage
from core.store.db import Database
from tests.bot.helpers import RecordingChannel, make_delivery

CHAT, OTHER_CHAT = -100, -200


class Engine:
    """The manager's side as the guard sees it: runs holding a slot, and requests it has picked up."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {}  # run id -> chat id
        self.picked: set[str] = set()
        self.written: list[tuple[int, str]] = []
        self.now = 0.0
        self.queued = 0  # requests waiting in the manager's queue

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        run_id = f"run-{len(self.written)}"
        self.written.append((chat_id, task))
        await asyncio.sleep(0)  # writing the request file yields, as the real spawner does
        return run_id

    def running(self, chat_id: int | None) -> int:
        return sum(1 for chat in self.live.values() if chat_id is None or chat == chat_id)

    async def picked_up(self, run_id: str) -> bool:
        return run_id in self.picked

    def guard(self, *, max_total: int = 3, max_per_chat: int = 3, queue_limit: int = 0) -> CapCheckedSpawner:
        return CapCheckedSpawner(
            self,
            self.running,
            self.picked_up,
            max_total=lambda: max_total,
            max_per_chat=lambda: max_per_chat,
            queued=lambda: self.queued,
            queue_limit=lambda: queue_limit,
            clock=lambda: self.now,
        )


async def test_a_spawn_over_the_chats_cap_is_refused_before_anything_is_written() -> None:
    engine = Engine()
    engine.live = {"a": CHAT}
    guard = engine.guard(max_per_chat=1)

    with pytest.raises(Exception, match="this chat's limit of 1 subagent run at once is reached"):
        await guard.spawn(CHAT, "t", "$ echo", None, False)

    assert engine.written == []
    assert await guard.spawn(OTHER_CHAT, "t", "$ echo", None, False) == "run-0"  # other chats are not held up


async def test_a_spawn_over_the_global_cap_is_refused() -> None:
    engine = Engine()
    engine.live = {"a": OTHER_CHAT, "b": OTHER_CHAT}

    with pytest.raises(Exception, match="the limit of 2 subagent runs at once"):
        await engine.guard(max_total=2).spawn(CHAT, "t", "$ echo", None, False)


async def test_over_the_cap_a_spawn_is_let_through_while_the_queue_has_room() -> None:
    engine = Engine()
    engine.live = {"a": OTHER_CHAT, "b": OTHER_CHAT}
    guard = engine.guard(max_total=2, queue_limit=2)
    engine.queued = 1

    assert await guard.spawn(CHAT, "t", "$ echo", None, False) == "run-0"  # it will wait in the queue
    # That one is not picked up yet: it takes the queue's last place, so the next is refused.
    with pytest.raises(Exception, match=r"the limit of 2 subagent runs at once .* the queue of 2 waiting requests"):
        await guard.spawn(CHAT, "t", "$ echo", None, False)


async def test_a_full_queue_refuses_over_the_chats_cap() -> None:
    engine = Engine()
    engine.live = {"a": CHAT}
    engine.queued = 3
    with pytest.raises(Exception, match="this chat's limit of 1 subagent run at once is reached and the queue"):
        await engine.guard(max_per_chat=1, queue_limit=3).spawn(CHAT, "t", "$ echo", None, False)


async def test_spawns_written_but_not_picked_up_count_even_when_called_together() -> None:
    engine = Engine()
    guard = engine.guard(max_per_chat=2)

    outcomes = await asyncio.gather(
        *(guard.spawn(CHAT, "t", f"$ echo {n}", None, False) for n in range(3)), return_exceptions=True
    )

    assert [o for o in outcomes if isinstance(o, str)] == ["run-0", "run-1"]
    assert len([o for o in outcomes if isinstance(o, Exception)]) == 1
    assert len(engine.written) == 2


async def test_once_picked_up_the_managers_count_is_what_counts() -> None:
    engine = Engine()
    guard = engine.guard(max_per_chat=1)
    await guard.spawn(CHAT, "t", "$ echo", None, False)

    engine.picked.add("run-0")  # the manager picked it up, and it already finished: not live any more

    assert await guard.spawn(CHAT, "t", "$ echo again", None, False) == "run-1"


async def test_a_request_never_picked_up_stops_counting_after_the_grace() -> None:
    engine = Engine()
    guard = engine.guard(max_per_chat=1)
    await guard.spawn(CHAT, "t", "$ echo", None, False)

    engine.now += PICKUP_GRACE_SECONDS + 1

    assert await guard.spawn(CHAT, "t", "$ echo again", None, False) == "run-1"


async def test_the_chat_hears_the_refusal_instead_of_started(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    engine = Engine()
    engine.live = {"a": CHAT}
    channel = RecordingChannel()
    delivery = make_delivery(db, channel)
    agent = MainAgent(
        lambda: offline_main_model("Crew"),
        messages,
        delivery,
        engine.guard(max_per_chat=1),
        assistant_name="Crew",
        history_window=50,
        timeout_seconds=10,
    )
    await chats.ensure(CHAT, "group", "Demo")
    await messages.add(
        NewMessage(chat_id=CHAT, sender_name="Alice", content="@crew background: $ echo hi", is_trigger=True)
    )

    await agent(Turn(id="turn-1", chat_id=CHAT, started_at=0.0))
    await channel.wait_for(lambda: bool(channel.sent))

    [(_, reply)] = channel.sent
    assert "Started subagent run" not in reply
    assert "Could not start the subagent: this chat's limit of 1 subagent run at once is reached" in reply
