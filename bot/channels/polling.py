"""Long polling that acknowledges an update only once it has been handled (stored), and that no update
can stop.

Telegram forgets an update when a later getUpdates asks for a higher offset. PTB's Updater asks for
the next batch while the current one is still being processed, so an update whose storing failed
(database locked, disk full) would be acknowledged and lost. Here the offset moves past an update
only after its handler returned; a storage failure retries the same update with backoff.

An update PTB cannot read (a field of an unexpected shape) would fail its whole batch inside
`get_updates`, and, never acknowledged, fail it again after every restart. getUpdates' transport reads
each update on its own and stands in for an unreadable one with its id and why; the poller logs it and
acknowledges it, and the rest of the batch goes on.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from core.backoff import backoff_seconds
from core.logging import get_logger

log = get_logger(__name__)

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
STORAGE_ERRORS = (sqlite3.OperationalError, sqlite3.DatabaseError, OSError)  # locked, disk full, I/O
UNREADABLE_KEY = "crewbot_unreadable"  # a stand-in update carries why the real one could not be read here
MAX_ERROR_CHARS = 300  # of an unreadable update's error, as logged


def _backoff(failures: int) -> float:
    return backoff_seconds(failures, first_seconds=FIRST_BACKOFF_SECONDS, max_seconds=MAX_BACKOFF_SECONDS)


class ReadableUpdatesRequest(HTTPXRequest):
    """getUpdates' transport (PTB sends nothing else through it): every update in a reply parses, because
    each one PTB cannot read is replaced by `{"update_id": N, UNREADABLE_KEY: why}` (PTB keeps the unknown
    key in `api_kwargs`)."""

    def __init__(self, read_timeout_seconds: float) -> None:
        super().__init__(connection_pool_size=1, read_timeout=read_timeout_seconds)  # PTB's for getUpdates

    @staticmethod
    def parse_json_payload(payload: bytes) -> dict[str, Any]:
        data = HTTPXRequest.parse_json_payload(payload)
        result = data.get("result") if isinstance(data, dict) else None
        if isinstance(result, list):
            data["result"] = [item for item in map(_readable, result) if item is not None]
        return data


def why_unreadable(fields: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """What is logged of an update PTB cannot read: the error, and what kind of update it was, not what it
    said (its content is the chat's, not the log's)."""
    return {
        "error_type": type(exc).__name__,
        "error": str(exc)[:MAX_ERROR_CHARS],
        "kinds": sorted(str(key) for key in fields if key != "update_id"),
    }


def _readable(item: object) -> dict[str, Any] | None:
    """The update as it came when PTB can read it, else its stand-in; None when it has no id to stand in by."""
    try:
        if not isinstance(item, dict):
            raise TypeError(f"an update is a JSON object, not {type(item).__name__}")
        Update.de_json(item, None)
        return item
    except Exception as exc:
        fields: dict[str, Any] = item if isinstance(item, dict) else {}
        why = why_unreadable(fields, exc)
        update_id = fields.get("update_id")
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            return {"update_id": update_id, UNREADABLE_KEY: why}
        # No id to acknowledge it by: the next update's acknowledgement covers it.
        log.error("update_dropped", reason="no update_id", **why)
        return None


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
        failures = 0
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
                failures += 1
                delay = _backoff(failures)
                log.warning("polling_failed", error=str(exc), error_type=type(exc).__name__, retry_in=delay)
                await asyncio.sleep(delay)
                continue
            except Exception:
                # A reply that is no list of updates at all (each update's own faults are stood in for).
                failures += 1
                delay = _backoff(failures)
                log.exception("polling_failed_unexpectedly", retry_in=delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            for update in updates:
                unreadable = update.api_kwargs.get(UNREADABLE_KEY)
                if unreadable is None:
                    await self._handle_until_stored(update)
                else:
                    # Skipped for good: the offset below acknowledges it, so no restart meets it again.
                    log.error("update_unreadable", update_id=update.update_id, **unreadable)
                self._offset = update.update_id + 1

    async def _handle_until_stored(self, update: Update) -> None:
        failures = 0
        while True:
            try:
                await self._handle(update)
                return
            except STORAGE_ERRORS as exc:
                # Not acknowledged: the same update is tried again, and nothing after it overtakes it.
                failures += 1
                delay = _backoff(failures)
                log.error("update_not_stored", update_id=update.update_id, error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
            except Exception:
                # A bug on one odd update must not wedge the chat: log it with the update and move on.
                log.exception("update_handler_failed", update_id=update.update_id)
                return


class Receiver(Protocol):
    async def run(self) -> None:
        """Loops until cancelled; returning or raising is a failure."""


class PollingTask:
    """The poller (or the webhook's watch) running in the background, and what ended it by itself (a revoked
    token, a bug), if anything: a stop is not a failure. The failure is logged once, when it happens, as
    `event`; a stop does not raise it."""

    def __init__(self, poller: Receiver, name: str, event: str = "polling_stopped") -> None:
        self._event = event
        self._failure: BaseException | None = None
        self._failed = asyncio.Event()
        self._task = asyncio.create_task(poller.run(), name=name)
        self._task.add_done_callback(self._ended)

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    async def wait_failure(self) -> BaseException:
        """Until polling ends by itself; never returns once stopped."""
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.wait({self._task})  # a failure was reported when it happened: not raised again here

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        self._failure = task.exception() or RuntimeError("polling returned")  # run() loops until cancelled
        log.critical(
            self._event, task=task.get_name(), error=str(self._failure), error_type=type(self._failure).__name__
        )
        self._failed.set()


def _seconds(value: object) -> float:
    total = getattr(value, "total_seconds", None)
    return float(total()) if callable(total) else float(value)  # type: ignore[arg-type]
