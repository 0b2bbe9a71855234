"""Long polling that acknowledges an update only once it has been handled (stored).

Telegram forgets an update when a later getUpdates asks for a higher offset. PTB's Updater asks for
the next batch while the current one is still being processed, so an update whose storing failed
(database locked, disk full) would be acknowledged and lost. Here the offset moves past an update
only after its handler returned; a storage failure retries the same update with backoff.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence

from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, NetworkError, RetryAfter, TelegramError

from core.logging import get_logger

log = get_logger(__name__)

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
STORAGE_ERRORS = (sqlite3.OperationalError, sqlite3.DatabaseError, OSError)  # locked, disk full, I/O


def _next_backoff(current: float) -> float:
    return min(current * 2, MAX_BACKOFF_SECONDS)


class Poller:
    def __init__(
        self,
        bot: Bot,
        handle: Callable[[Update], Awaitable[None]],
        *,
        timeout_seconds: int,
        allowed_updates: Sequence[str],
    ) -> None:
        self._bot = bot
        self._handle = handle
        self._timeout_seconds = timeout_seconds
        self._allowed_updates = list(allowed_updates)
        self._offset: int | None = None

    async def run(self) -> None:
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            try:
                updates = await self._bot.get_updates(
                    offset=self._offset, timeout=self._timeout_seconds, allowed_updates=self._allowed_updates
                )
            except RetryAfter as exc:
                await asyncio.sleep(_seconds(exc.retry_after))
                continue
            except InvalidToken:
                log.critical("telegram_token_rejected")
                raise
            except (NetworkError, Conflict, TelegramError) as exc:
                # Telegram or the network is down, or another instance polls with this token: wait, go on.
                log.warning("polling_failed", error=str(exc), error_type=type(exc).__name__, retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = _next_backoff(backoff)
                continue
            backoff = FIRST_BACKOFF_SECONDS
            for update in updates:
                await self._handle_until_stored(update)
                self._offset = update.update_id + 1

    async def _handle_until_stored(self, update: Update) -> None:
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            try:
                await self._handle(update)
                return
            except STORAGE_ERRORS as exc:
                # Not acknowledged: the same update is tried again, and nothing after it overtakes it.
                log.error("update_not_stored", update_id=update.update_id, error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = _next_backoff(backoff)
            except Exception:
                # A bug on one odd update must not wedge the chat: log it with the update and move on.
                log.exception("update_handler_failed", update_id=update.update_id)
                return


def _seconds(value: object) -> float:
    total = getattr(value, "total_seconds", None)
    return float(total()) if callable(total) else float(value)  # type: ignore[arg-type]
