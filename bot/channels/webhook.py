"""Telegram's webhook: updates POSTed by Telegram (through the operator's reverse proxy) to a listener on
TELEGRAM_WEBHOOK_LISTEN, each answered 200 only once it is handled (stored), as polling acknowledges it.

Connections come first: a bounded number at once, none held idle or half-sent (bot/channels/webhook_guard.py).
What a request is answered, in the order it is checked:
- a path other than TELEGRAM_WEBHOOK_URL's, or a method other than POST: 404 / 405;
- no `X-Telegram-Bot-Api-Secret-Token`, or another one (compared in constant time): 403, before the body is read;
- no Content-Length (a chunked body), or one over MAX_BODY_BYTES: 411 / 413, before the body is read;
- a body that is not JSON, or JSON that is no update (an object with an integer update_id): 400.
  Each of these kinds is logged the first time (a scanner must not fill the log), the rest only counted; the
  counts are logged at stop.
- an update PTB cannot read (a field of an unexpected shape): logged with its id, answered 200. It came with
  the secret, so from Telegram, which redelivers anything not 2xx for up to a day and holds that chat's later
  updates back meanwhile: as in polling, it is skipped for good;
- an update whose id was handled moments ago (Telegram delivers again when our 200 was lost): 200 at once;
- any other: handled, then 200. A storage failure (database locked, disk full): 500, and Telegram delivers
  it again later; any other error of the handler: logged with the update's id, 200 (as in polling: a bug on
  one odd update must not wedge its chat).

Updates are handled one at a time, as polling hands them over: the handler stores and hands off, so this
costs little, and the router never sees two updates at once. Telegram itself sends one chat's updates one
at a time (the next after the previous one's answer), so a chat's order is Telegram's order.

The recent ids: the router already ignores a redelivered message (a message is stored once by chat and
message id, an edit by its edit time). But not every update is a stored message: a membership change (a
removal gives up the chat's owed messages), /start in a chat not allowed (an unstored reply, sent again), a
group's migration. Skipping an id handled moments ago keeps those from running twice when only our answer
was lost; it is memory only, so after a restart the store's own duplicate check is what remains.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Bot, Update

from bot.channels.polling import STORAGE_ERRORS, why_unreadable
from bot.channels.webhook_guard import ConnectionGuard, ConnectionLimits
from core.capped_site import CappedTCPSite
from core.logging import get_logger

if TYPE_CHECKING:
    from core.settings import Settings

log = get_logger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY_BYTES = 1024 * 1024  # Telegram's updates are a few KB; a message is at most 4,096 characters
READ_TIMEOUT_SECONDS = 10.0  # a body that trickles in (only a sender with the secret gets this far)
RECENT_IDS = 1024  # update ids remembered as handled
SHUTDOWN_GRACE_SECONDS = 5.0  # at stop, an update being stored gets this long to finish and be answered

Handle = Callable[[Update], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    url: str  # public, https: where Telegram POSTs
    secret: str  # Telegram sends it in SECRET_HEADER with every update
    host: str  # where the listener binds (the reverse proxy's upstream)
    port: int

    @property
    def path(self) -> str:
        """The path served: the URL's own, so the proxy passes requests through unchanged."""
        return urlsplit(self.url).path or "/"

    @property
    def listen(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def of(cls, settings: Settings) -> WebhookConfig | None:
        """Webhook mode's configuration; None in polling mode (TELEGRAM_WEBHOOK_URL empty)."""
        from core.setting_webhook import host_port

        if settings.telegram_webhook_url is None or settings.telegram_webhook_secret is None:
            return None
        host, port = host_port(settings.telegram_webhook_listen)
        return cls(settings.telegram_webhook_url, settings.telegram_webhook_secret.get_secret_value(), host, port)


class WebhookProblem(Exception):
    """Webhook mode cannot start or go on: the cause and its fix, as crewbot's one-line failures read."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}: {fix}")
        self.cause = cause
        self.fix = fix


class RecentIds:
    """The last `size` update ids handled, oldest forgotten first."""

    def __init__(self, size: int) -> None:
        self._order: deque[int] = deque()
        self._ids: set[int] = set()
        self._size = size

    def __contains__(self, update_id: int) -> bool:
        return update_id in self._ids

    def add(self, update_id: int) -> None:
        if update_id in self._ids:
            return
        self._order.append(update_id)
        self._ids.add(update_id)
        if len(self._order) > self._size:
            self._ids.discard(self._order.popleft())


class Rejected(Exception):
    def __init__(self, kind: str, status: int, text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.status = status


class WebhookListener:
    """The HTTP side: checks each request, hands each update to `handle`, answers once it returned."""

    def __init__(self, config: WebhookConfig, bot: Bot, handle: Handle, limits: ConnectionLimits | None = None) -> None:
        self._config = config
        self.guard = ConnectionGuard(limits or ConnectionLimits())  # its connections (bot/channels/webhook_guard.py)
        self._secret = config.secret.encode()
        self._bot = bot
        self._handle = handle
        self._lock = asyncio.Lock()
        self._recent = RecentIds(RECENT_IDS)
        self._runner: web.AppRunner | None = None
        self.rejected: Counter[str] = Counter()  # refused requests by kind
        self.port: int | None = None  # the bound port

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._receive)
        limits = self.guard.limits
        # aiohttp's own keep-alive closes silently and uncounted: it stays only as a backstop, after the guard's.
        backstop_seconds = limits.head_timeout_seconds + limits.keepalive_seconds
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_SECONDS, keepalive_timeout=backstop_seconds
        )
        await runner.setup()
        site = CappedTCPSite(
            runner,
            self._config.host,
            self._config.port,
            max_connections=limits.max_connections,
            on_refused=self.guard.over_cap,
            wrap=self.guard.watch,
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise WebhookProblem(
                f"cannot listen on TELEGRAM_WEBHOOK_LISTEN={self._config.listen} ({exc.strerror or exc})",
                "stop what listens there, or choose another TELEGRAM_WEBHOOK_LISTEN and point the proxy at it",
            ) from None
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or []  # aiohttp keeps the asyncio server here
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._config.port
        log.info("webhook_listening", host=self._config.host, port=self.port, path=self._config.path)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await runner.cleanup()  # waits up to SHUTDOWN_GRACE_SECONDS for updates being stored
        if self.rejected:
            log.info("webhook_requests_rejected", counts=dict(self.rejected))
        self.guard.log_counts()

    async def _receive(self, request: web.Request) -> web.Response:
        self.guard.request_began(request.protocol)
        try:
            return await self._answer(request)
        finally:
            self.guard.request_ended(request.protocol)

    async def _answer(self, request: web.Request) -> web.Response:
        try:
            data = await self._checked_body(request)
            update = self._update(data)
        except Rejected as refused:
            self.rejected[refused.kind] += 1
            if self.rejected[refused.kind] == 1:
                log.warning(
                    "webhook_request_rejected",
                    kind=refused.kind,
                    status=refused.status,
                    remote=request.headers.get("X-Forwarded-For", request.remote),
                    note="further ones of this kind are counted, not logged (the counts are logged at stop)",
                )
            return web.Response(status=refused.status, text=f"{refused}\n")
        if update is None:
            return web.Response(text="ok\n")  # unreadable: logged, acknowledged
        return await self._handled(update)

    async def _checked_body(self, request: web.Request) -> Any:
        if request.path != self._config.path:
            raise Rejected("wrong_path", 404, "not found")
        if request.method != "POST":
            raise Rejected("wrong_method", 405, "POST only")
        token = request.headers.get(SECRET_HEADER)
        if token is None:
            raise Rejected("no_secret", 403, "forbidden")
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), self._secret):
            raise Rejected("wrong_secret", 403, "forbidden")
        length = request.content_length
        if length is None:
            raise Rejected("no_length", 411, "Content-Length required")
        if length > MAX_BODY_BYTES:
            raise Rejected("too_large", 413, f"at most {MAX_BODY_BYTES} bytes")
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                body = await request.read()
        except (TimeoutError, web.HTTPException, ConnectionError, asyncio.IncompleteReadError):
            raise Rejected("unread_body", 400, "body not received") from None
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise Rejected("invalid_json", 400, "not JSON") from None

    def _update(self, data: Any) -> Update | None:
        """The update; None for one PTB cannot read (logged); Rejected for JSON that is no update."""
        update_id = data.get("update_id") if isinstance(data, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            raise Rejected("not_an_update", 400, "not an update")
        try:
            return Update.de_json(data, self._bot)
        except Exception as exc:
            log.error("update_unreadable", update_id=update_id, **why_unreadable(data, exc))
            return None

    async def _handled(self, update: Update) -> web.Response:
        async with self._lock:
            if update.update_id in self._recent:
                log.info("update_redelivered", update_id=update.update_id)
                return web.Response(text="ok\n")
            try:
                await self._handle(update)
            except STORAGE_ERRORS as exc:
                # Not stored: Telegram delivers it again (its retries back off on their own).
                log.error("update_not_stored", update_id=update.update_id, error=str(exc), retry="by Telegram")
                return web.Response(status=500, text="not stored, try again\n")
            except Exception:
                log.exception("update_handler_failed", update_id=update.update_id)
            self._recent.add(update.update_id)
        return web.Response(text="ok\n")
