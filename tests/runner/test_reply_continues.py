"""A reply to a `[Subagent]` result continues that run: the next run of the replying turn starts from the
earlier run's own session (not the chat's latest) and is labelled as a follow-up. Real store, the real
outbox and run channels, the in-memory container runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from container.channel import RunChannel
from container.task import RunResult
from core.store.messages import NewMessage
from core.store.runs import RunStatus
from core.store.turns import TurnStore
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import CHAT_ID, Rig, rig

pytestmark = pytest.mark.timeout(60)


def history(said: str) -> bytes:
    """A one-exchange pydantic-ai message history whose user prompt is `said`."""
    return json.dumps(
        [
            {
                "kind": "request",
                "parts": [{"part_kind": "user-prompt", "content": said, "timestamp": "2026-01-01T00:00:00Z"}],
            },
            {
                "kind": "response",
                "parts": [{"part_kind": "text", "content": "done"}],
                "timestamp": "2026-01-01T00:00:01Z",
            },
        ]
    ).encode()


class Histories:
    """Each run saves a session naming its task, and the test keeps the history each run started from."""

    def __init__(self) -> None:
        self.started_with: dict[str, str] = {}

    async def behaviour(self, channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        self.started_with[task.task] = json.dumps(task.history)
        await channel.save_session(history(f"session of {task.task}"))
        await channel.report(RunResult(status="completed", result=f"result of {task.task}"))
        return 0


async def finish(r: Rig, task: str, turn_id: str | None = None) -> str:
    run_id = await r.spawn(task, turn_id=turn_id)
    await r.until_status(run_id, RunStatus.COMPLETED)
    await r.until(lambda: any(f"result of {task}" in t for t in r.texts()))
    await r.settled()
    return run_id


async def reply_turn(r: Rig, turn_id: str, reply_to: int | None) -> None:
    """What the router and engine store for a trigger message (a reply or not) and the turn it starts."""
    row_id = await r.stores.messages.add(
        NewMessage(
            chat_id=CHAT_ID, sender_name="Alice", content="now add the charts", is_trigger=True, reply_to=reply_to
        )
    )
    await TurnStore(r.stores.db).start(turn_id, CHAT_ID, trigger_message_id=row_id)


def platform_id_of(r: Rig, text: str) -> int:
    """The id the chat gave the result message when it was sent."""
    return next(i for (_, part), i in zip(r.channel.sent, r.channel.sent_ids, strict=True) if text in part)


async def test_a_reply_to_a_result_continues_that_runs_session(tmp_path: Path) -> None:
    histories = Histories()
    async with rig(tmp_path, histories.behaviour) as r:
        report = await finish(r, "the report")
        await finish(r, "the weather")  # now the chat's latest session is the weather's

        await reply_turn(r, "turn-reply", platform_id_of(r, "result of the report"))
        follow_up = await finish(r, "add the charts", turn_id="turn-reply")

        assert "session of the report" in histories.started_with["add the charts"]
        assert "session of the weather" not in histories.started_with["add the charts"]
        record = await r.service.runs.get(follow_up)
        previous = await r.service.runs.get(report)
        assert record is not None and previous is not None
        assert record.label == f"follow-up: {previous.label}"


async def test_a_message_that_is_no_reply_starts_from_the_chats_latest_session(tmp_path: Path) -> None:
    histories = Histories()
    async with rig(tmp_path, histories.behaviour) as r:
        await finish(r, "the report")
        await finish(r, "the weather")
        await reply_turn(r, "turn-plain", None)
        run_id = await finish(r, "something else", turn_id="turn-plain")
        assert "session of the weather" in histories.started_with["something else"]
        record = await r.service.runs.get(run_id)
        assert record is not None and not record.label.startswith("follow-up")
