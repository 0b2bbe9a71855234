"""What the app hands the turn engine and the channel: the turns' lifecycle in the store (and the cascading
cancel of an aborted turn), and the chats store as the channel's directory of conversations."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bot.commands import RunControl
from bot.turns.engine import AbortReason, Turn
from core.logging import get_logger
from core.settings import CancelScope
from core.store.chats import ChatAddress, ChatStore
from core.store.turns import TurnStatus, TurnStore

log = get_logger(__name__)


class TurnRecorder:
    """The engine's TurnLifecycle: turns in the store, and the cascading cancel of an aborted turn."""

    def __init__(self, turns: TurnStore, scope: CancelScope, runs: RunControl | None) -> None:
        self._turns = turns
        self._scope = scope
        self.runs = runs

    async def turn_started(self, turn: Turn) -> None:
        # The results of the turn's subagents reply to the message that asked, as its answer does.
        await self._turns.start(turn.id, turn.chat_id, trigger_message_id=turn.trigger_id)

    async def turn_ended(self, turn: Turn, status: TurnStatus) -> None:
        await self._turns.end(turn.id, status)

    async def turn_aborted(self, turn: Turn, reason: AbortReason) -> None:
        runs = self.runs
        if runs is None:
            await self._turns.end(turn.id, TurnStatus.ABORTED)
            return
        # /stop stops everything of the chat; a Stop button and a merge follow MERGE_CANCEL_SCOPE.
        if self._scope is CancelScope.CHAT or reason is AbortReason.STOP:
            why = f"turn {turn.id} aborted ({reason})"

            def sweep() -> Awaitable[int]:
                return runs.cancel_chat(turn.chat_id, why)
        else:

            def sweep() -> Awaitable[int]:
                return runs.cancel_turn(turn.id, f"turn aborted ({reason})")

        # The live runs' kills go out at once, beside the turn's mark; a second sweep after the mark takes
        # what started meanwhile (a spawn request of this turn picked up later sees the mark and never starts).
        first = asyncio.ensure_future(sweep())
        try:
            await self._turns.end(turn.id, TurnStatus.ABORTED)
            cancelled = await first + await sweep()
        except Exception:
            log.exception("cascade_cancel_failed", turn_id=turn.id)
            return
        finally:
            if not first.done():
                await asyncio.gather(first, return_exceptions=True)
        log.info("turn_aborted", turn_id=turn.id, chat_id=turn.chat_id, reason=reason, runs_cancelled=cancelled)


class AllowedTopics:
    """The chats store as the channel's directory, except that a topic of a chat the bot does not work in
    gets no row: strangers' forums leave nothing behind (their messages are then refused by the router)."""

    def __init__(self, chats: ChatStore, allowed: Callable[[int], Awaitable[bool]]) -> None:
        self._chats = chats
        self._allowed = allowed  # the app's conversation_allowed

    async def resolve(self, platform_chat_id: int, thread_id: int | None, kind: str, title: str | None) -> int:
        if thread_id is not None and not await self._allowed(platform_chat_id):
            return platform_chat_id
        return await self._chats.resolve(platform_chat_id, thread_id, kind, title)

    async def address(self, chat_id: int) -> ChatAddress:
        return await self._chats.address(chat_id)

    async def conversations_of(self, platform_chat_id: int) -> list[int]:
        return await self._chats.conversations_of(platform_chat_id)

    async def migrate(self, old_platform_id: int, new_platform_id: int) -> list[int]:
        return await self._chats.migrate(old_platform_id, new_platform_id)
