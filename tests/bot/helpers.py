"""Fakes at the edge for the tests under tests/bot: a recording channel, spawner, run control, lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from bot.channels.base import Channel, ChatDirectory, InboundHandler, MembershipHandler
from bot.channels.inbound import InboundMessage
from bot.ports.runs import RunSummary
from bot.turns.engine import AbortReason, Turn
from core.delivery import Delivery
from core.outbox import Outbox
from core.store.chat_files import FileUnavailable
from core.store.db import Database
from core.store.outbox import OutboxStore, OutgoingFile
from core.store.runs import RunStatus
from core.store.turns import TurnStatus

# Upper bound for any wait on an event: only there so a broken test fails instead of hanging.
WAIT_SECONDS = 5.0


class Recorder:
    """State changed by the code under test; `wait_for` wakes on every change (no polling)."""

    def __init__(self) -> None:
        self._tick = asyncio.Event()

    def changed(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], limit_seconds: float = WAIT_SECONDS) -> None:
        async with asyncio.timeout(limit_seconds):
            while not predicate():
                await self._tick.wait()


class RecordingChannel(Recorder):
    """A `Channel` that records what the core sends; `admin` is the answer to every admin check."""

    name = "recording"

    def __init__(self, *, admin: bool = False) -> None:
        super().__init__()
        self.admin = admin
        self.sent: list[tuple[int, str]] = []
        self.typing: list[int] = []
        self.admin_checks: list[tuple[int, int]] = []
        self.handler: InboundHandler | None = None
        self.sent_ids: list[int] = []
        self.sent_files: list[tuple[int, OutgoingFile, str, int | None]] = []  # chat, file, caption, reply_to
        self.downloads: dict[str, bytes] = {}  # what download_file answers, by file id
        self._next_id = 1000

    async def start(
        self,
        handler: InboundHandler,
        on_membership: MembershipHandler | None = None,
        directory: ChatDirectory | None = None,
    ) -> None:
        self.handler = handler

    async def stop_receiving(self) -> None:
        self.handler = None

    async def stop(self) -> None:
        self.handler = None

    def split(self, text: str) -> list[str]:
        return [text]

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        self.sent.append((chat_id, part))
        self._next_id += 1
        self.sent_ids.append(self._next_id)  # the platform id of each send, in the order of `sent`
        self.changed()
        return self._next_id

    async def send_text(self, chat_id: int, text: str) -> list[int]:
        message_id = await self.send_part(chat_id, text)
        return [message_id] if message_id is not None else []

    async def send_file(
        self, chat_id: int, file: OutgoingFile, caption: str, reply_to: int | None = None
    ) -> int | None:
        self.sent_files.append((chat_id, file, caption, reply_to))
        self._next_id += 1
        self.changed()
        return self._next_id

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        data = self.downloads.get(file_id)
        if data is None:
            raise FileUnavailable(f"no file {file_id}")
        if len(data) > max_bytes:
            raise FileUnavailable(f"it is over the limit of {max_bytes} bytes")
        return data

    async def send_typing(self, chat_id: int) -> None:
        self.typing.append(chat_id)
        self.changed()

    async def is_chat_admin(self, chat_id: int, user_id: int) -> bool:
        self.admin_checks.append((chat_id, user_id))
        return self.admin

    def texts(self, chat_id: int) -> list[str]:
        return [text for cid, text in self.sent if cid == chat_id]


SpawnCall = tuple[int, str, str, str | None, bool]


class RecordingSpawner:
    """Records spawn requests; returns `run_id`, or raises `error` when one is set."""

    def __init__(self, run_id: str = "run-abc123", error: Exception | None = None) -> None:
        self.run_id = run_id
        self.error = error
        self.calls: list[SpawnCall] = []
        self.files: list[tuple[str, ...]] = []  # the files each call named, in the order of `calls`

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        self.calls.append((chat_id, turn_id, task, label, include_context))
        self.files.append(tuple(files))
        if self.error is not None:
            raise self.error
        return self.run_id


class FakeRunControl:
    """`RunControl` with canned answers; every call is recorded as (method, args...)."""

    def __init__(
        self,
        runs: list[RunSummary] | None = None,
        cancel_outcome: RunStatus | None = RunStatus.CANCELLED,
        chat_cancelled: int = 0,
    ) -> None:
        self.runs = runs or []
        self.cancel_outcome = cancel_outcome
        self.chat_cancelled = chat_cancelled
        self.calls: list[tuple[object, ...]] = []

    async def list_runs(self, chat_id: int, limit: int) -> list[RunSummary]:
        self.calls.append(("list_runs", chat_id, limit))
        return self.runs[:limit]

    async def cancel_run(self, chat_id: int, run_id: str) -> RunStatus | None:
        self.calls.append(("cancel_run", chat_id, run_id))
        return self.cancel_outcome

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        self.calls.append(("cancel_chat", chat_id, reason))
        return self.chat_cancelled

    async def cancel_turn(self, turn_id: str, reason: str) -> int:
        self.calls.append(("cancel_turn", turn_id, reason))
        return 0


class RecordingLifecycle(Recorder):
    """`TurnLifecycle` that records every call; `start_gate`, when set, holds `turn_started` until it is set,
    and `abort_gate` holds `turn_aborted` (the cascade: the aborted turn's subagents being stopped)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[Turn] = []
        self.ended: list[tuple[Turn, str]] = []
        self.aborted: list[tuple[Turn, str]] = []
        self.events: list[tuple[str, str]] = []  # (what, turn id) in the order they happened
        self.start_gate: asyncio.Event | None = None
        self.abort_gate: asyncio.Event | None = None

    async def turn_started(self, turn: Turn) -> None:
        self.started.append(turn)
        self.events.append(("started", turn.id))
        self.changed()
        if self.start_gate is not None:
            await self.start_gate.wait()

    async def turn_ended(self, turn: Turn, status: TurnStatus) -> None:
        self.ended.append((turn, status))
        self.events.append((f"ended:{status}", turn.id))
        self.changed()

    async def turn_aborted(self, turn: Turn, reason: AbortReason) -> None:
        self.aborted.append((turn, reason))
        self.events.append((f"aborted:{reason}", turn.id))
        self.changed()
        if self.abort_gate is not None:
            await self.abort_gate.wait()
            self.events.append(("cascade_done", turn.id))


class ControlledRunner(Recorder):
    """A TurnRunner that waits until the test calls `finish(turn)`; records starts, cancels, completions."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[Turn] = []
        self.cancelled: list[Turn] = []
        self.completed: list[Turn] = []
        self.active: dict[int, int] = {}
        self.max_active: dict[int, int] = {}
        self._gates: dict[str, asyncio.Event] = {}

    def _gate(self, turn: Turn) -> asyncio.Event:
        return self._gates.setdefault(turn.id, asyncio.Event())

    def finish(self, turn: Turn) -> None:
        self._gate(turn).set()

    async def __call__(self, turn: Turn) -> None:
        chat = turn.chat_id
        self.active[chat] = self.active.get(chat, 0) + 1
        self.max_active[chat] = max(self.max_active.get(chat, 0), self.active[chat])
        self.started.append(turn)
        self.changed()
        try:
            await self._gate(turn).wait()
        except asyncio.CancelledError:
            self.cancelled.append(turn)
            self.changed()
            raise
        finally:
            self.active[chat] -= 1
        self.completed.append(turn)
        self.changed()

    async def next_started(self, count: int) -> Turn:
        """The `count`-th turn to start (1-based), once it has."""
        await self.wait_for(lambda: len(self.started) >= count)
        return self.started[count - 1]


def inbound(
    chat_id: int,
    text: str,
    *,
    platform_message_id: int | None,
    sender_id: int = 42,
    sender_name: str = "Alice",
    chat_kind: str = "group",
    triggers: bool = False,
    command: str | None = None,
    command_args: tuple[str, ...] = (),
) -> InboundMessage:
    return InboundMessage(
        chat_id=chat_id,
        chat_kind=chat_kind,
        chat_title="Test group",
        sender_id=sender_id,
        sender_name=sender_name,
        text=text,
        platform_message_id=platform_message_id,
        triggers=triggers,
        command=command,
        command_args=command_args,
    )


def make_delivery(messages_db: Database, channel: Channel, assistant_name: str = "Crew") -> Delivery:
    """The real Delivery over the real outbox, sending through `channel` (no dispatcher: sends are inline)."""
    store = OutboxStore(messages_db)
    return Delivery(store, Outbox(store, channel), assistant_name)
