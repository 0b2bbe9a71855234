"""A fake Telegram Bot API server on 127.0.0.1 for the real PTB `Application` to talk to.

    async with FakeTelegram() as tg:               # in the test's loop
        app = ApplicationBuilder().token(tg.token).base_url(tg.base_url).build()
        tg.push_message(-100123, "hello @crew_test_bot")
        [reply] = await tg.wait_for_messages(-100123, 1)
        tg.push_media_message(-100123, "document", b"...", file_name="notes.txt", caption="for @crew_test_bot")
        [sent] = await tg.wait_for_files(-100123, 1)   # what the bot sent with sendDocument / sendPhoto
        query = tg.push_callback_query(-100123, reply.message_id, "data", user_id=1001)  # a button pressed
        answer = await tg.wait_for_answer(query)       # answerCallbackQuery: text, show_alert
        tg.buttons(-100123, reply.message_id)          # its inline keyboard now (editMessageReplyMarkup too)

    with FakeTelegram() as tg:                     # on its own thread, e.g. for a bot subprocess
        ...

Requests go to `/bot<TOKEN>/<method>`, parameters form-encoded (PTB; nested objects as JSON strings),
JSON or multipart. Answers are Bot API shaped: `{"ok": true, "result": ...}` or
`{"ok": false, "error_code": N, "description": "..."}`. Files are downloaded from
`/file/bot<TOKEN>/<file_path>` (getFile's file_path): give PTB `base_file_url=tg.base_file_url`.
Every accessor is thread-safe.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

from tests.fakes.faults import Fault, FaultQueue
from tests.fakes.loopback_server import LoopbackServer
from tests.fakes.telegram_callback_methods import CallbackSide
from tests.fakes.telegram_files import MAX_UPLOAD_BYTES, FileDownload, MediaKind, SentFile
from tests.fakes.telegram_holds import Holds
from tests.fakes.telegram_http import UploadedFile, answer, chat_param, read_params, serve_truncated
from tests.fakes.telegram_keyboards import CallbackAnswer, CallbackQuery
from tests.fakes.telegram_methods import BotApi
from tests.fakes.telegram_params import ApiError, Params
from tests.fakes.telegram_pushes import DEFAULT_USER_FIRST_NAME, DEFAULT_USER_ID, UserSide
from tests.fakes.telegram_rate import GroupRate, GroupRateSide
from tests.fakes.telegram_state import (
    ApiCall,
    ChatAction,
    Draft,
    Edit,
    JsonDict,
    SentMessage,
    TelegramData,
    chat_type_for,
)
from tests.fakes.telegram_webhook import WebhookSide
from tests.fakes.waiting import Watch

__all__ = [
    "DEFAULT_TOKEN",
    "DEFAULT_USER_FIRST_NAME",
    "DEFAULT_USER_ID",
    "ApiCall",
    "CallbackAnswer",
    "CallbackQuery",
    "ChatAction",
    "Draft",
    "Edit",
    "FakeTelegram",
    "Fault",
    "FileDownload",
    "MediaKind",
    "SentFile",
    "SentMessage",
    "UploadedFile",
]

T = TypeVar("T")

DEFAULT_TOKEN = "123456789:AAFakeTokenForCrewbotTests012345678"  # Telegram's shape: <bot id>:<35 chars>
DEFAULT_BOT_USERNAME = "crew_test_bot"
DEFAULT_BOT_FIRST_NAME = "Crew"
DEFAULT_WAIT_SECONDS = 5.0
MAX_REQUEST_BYTES = MAX_UPLOAD_BYTES + 1024 * 1024  # a 50 MB file and the form around it

_API_PATH = re.compile(r"^/bot(?P<token>[^/]+)/(?P<method>[^/]+)/?$")
_FILE_PATH = re.compile(r"^/file/bot(?P<token>[^/]+)/(?P<path>.+)$")
_DOWNLOAD_FAULT_PREFIX = "file:"  # FaultQueue keys of download faults: "file:<file_id>"


class FakeTelegram(LoopbackServer, UserSide, CallbackSide, WebhookSide, GroupRateSide):
    """The Bot API for one bot (its token and identity), with test controls to drive it."""

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        bot_username: str = DEFAULT_BOT_USERNAME,
        bot_first_name: str = DEFAULT_BOT_FIRST_NAME,
        can_read_all_group_messages: bool = True,
        strict_html: bool = True,
        port: int = 0,
    ) -> None:
        """`strict_html` also rejects a bare "&" in HTML (Telegram keeps it); see telegram_html."""
        super().__init__(port=port)
        bot_id, _, secret = token.partition(":")
        if not bot_id.isdigit() or not secret:
            raise ValueError(f"a bot token looks like '<bot id>:<secret>', not {token!r}")
        self._token = token
        self._lock = threading.RLock()
        self._watch = Watch(self._lock)
        self._faults = FaultQueue()
        self._group_rate = GroupRate(self._lock)
        self._holds = Holds(self._lock, self._watch, lambda: self.closing)
        self._data = TelegramData(
            bot_user={
                "id": int(bot_id),
                "is_bot": True,
                "first_name": bot_first_name,
                "username": bot_username,
                "can_join_groups": True,
                "can_read_all_group_messages": can_read_all_group_messages,
                "supports_inline_queries": False,
                "can_connect_to_business": False,
                "has_main_web_app": False,
            }
        )
        self._api = BotApi(self._data, self._lock, self._watch, strict_html=strict_html, closing=lambda: self.closing)

    # --- identity -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """For `ApplicationBuilder().base_url(...)` / `Bot(base_url=...)`: PTB appends token and method."""
        return f"{self.origin}/bot"

    @property
    def base_file_url(self) -> str:
        """For `Bot(base_file_url=...)`: PTB downloads from `<base_file_url><token>/<file_path>`."""
        return f"{self.origin}/file/bot"

    @property
    def token(self) -> str:
        return self._token

    @property
    def bot_id(self) -> int:
        return self._data.bot_id

    @property
    def bot_username(self) -> str:
        return str(self._data.bot_user["username"])

    @property
    def bot_user(self) -> JsonDict:
        """The bot as a User object, as it appears in `from` of its messages."""
        with self._lock:
            return self._data.user(self.bot_id)

    # --- HTTP -----------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def _on_closing(self) -> None:
        self._watch.notify()  # long polls answer [] and hung requests end

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        match = _API_PATH.match(request.path)
        if match is None:
            download = _FILE_PATH.match(request.path)
            if download is not None and request.method in ("GET", "HEAD"):
                return await self._serve_download(request, download["token"], download["path"])
            return answer(ApiError(404, "Not Found").body(), 404)
        if match["token"] != self._token:
            return answer(ApiError(401, "Unauthorized").body(), 401)
        try:
            params = Params(await read_params(request))
        except ApiError as exc:
            return answer(exc.body(), exc.status)
        method = self._api.canonical(match["method"]) or match["method"]
        self._api.record_call(method, params)
        chat = chat_param(params)
        fault = self._faults.take(method) or self._group_rate.refuse(method, chat)  # a group's limit too
        fault = fault or await self._holds.pass_through(method, chat)
        if fault is not None and fault.kind != "truncate":
            return await self._serve_fault(request, fault)
        try:
            result = await self._api.call(method, params)
        except ApiError as exc:
            return answer(exc.body(), exc.status)
        if fault is not None:  # the call took effect, but its answer is cut short
            body = answer({"ok": True, "result": result}, 200).body
            assert isinstance(body, bytes)
            return await serve_truncated(request, body, fault.sent_bytes, content_type="application/json")
        return answer({"ok": True, "result": result}, 200)

    async def _serve_download(self, request: web.Request, token: str, file_path: str) -> web.StreamResponse:
        if token != self._token:
            return answer(ApiError(401, "Unauthorized").body(), 401)
        with self._lock:
            stored = self._data.files.at_path(file_path)
            if stored is None:
                return answer(ApiError(404, "Not Found").body(), 404)
            fault = self._faults.take(_DOWNLOAD_FAULT_PREFIX + stored.file_id)
            download = FileDownload(stored.file_id, file_path, fault.kind if fault else None, time.monotonic())
            self._data.files.downloads.append(download)
            self._watch.notify()
        if fault is not None and fault.kind == "truncate":
            return await serve_truncated(request, stored.data, fault.sent_bytes)
        if fault is not None:
            return await self._serve_fault(request, fault)
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def _serve_fault(self, request: web.Request, fault: Fault) -> web.StreamResponse:
        if fault.kind == "disconnect":
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        if fault.kind == "hang":
            await self._watch.wait_for(lambda: True if self.closing else None, None)
            return answer(ApiError(500, "Internal Server Error").body(), 500)
        parameters = {"retry_after": fault.retry_after_seconds} if fault.retry_after_seconds else None
        return answer(ApiError(fault.status, fault.description, parameters).body(), fault.status)

    # --- chat membership and failures -----------------------------------------------------------

    def set_chat_admins(self, chat_id: int, user_ids: list[int], *, owner_id: int | None = None) -> None:
        """getChatMember/getChatAdministrators answer these as administrators (owner_id: creator).

        Include the bot's id to let it delete other people's messages. Everyone else is a member.
        """
        with self._lock:
            self._data.admins[chat_id] = list(user_ids)
            if owner_id is None:
                self._data.owners.pop(chat_id, None)
            else:
                self._data.owners[chat_id] = owner_id

    def block_chat(self, chat_id: int, description: str | None = None) -> None:
        """Every method on this chat answers 403 until unblock_chat (the bot was kicked or blocked)."""
        with self._lock:
            kind = self._data.chats[chat_id]["type"] if chat_id in self._data.chats else chat_type_for(chat_id)
            default = {
                "private": "Forbidden: bot was blocked by the user",
                "group": "Forbidden: bot was kicked from the group chat",
                "supergroup": "Forbidden: bot was kicked from the supergroup chat",
            }[kind]
            self._data.blocked[chat_id] = description or default

    def unblock_chat(self, chat_id: int) -> None:
        with self._lock:
            self._data.blocked.pop(chat_id, None)

    def fail_next(self, method: str, fault: Fault, count: int = 1) -> None:
        """The next `count` calls of `method` (any letter case) get `fault` instead of an answer."""
        canonical = self._api.canonical(method)
        if canonical is None:
            raise ValueError(f"the fake does not serve {method!r}")
        self._faults.add(canonical, fault, count)

    def fail_next_download(self, file_id: str, fault: Fault, count: int = 1) -> None:
        """The next `count` downloads of the file get `fault`: Fault.truncate() sends part of the bytes under
        the full Content-Length and closes the connection; error, disconnect and hang as for methods."""
        with self._lock:
            if file_id not in self._data.files.files:
                raise ValueError(f"no file {file_id!r} to fail")
        self._faults.add(_DOWNLOAD_FAULT_PREFIX + file_id, fault, count)

    def forget_file(self, file_id: str) -> None:
        """Telegram no longer knows the file_id: getFile answers 400 "invalid file_id", sending it again
        400 "wrong file identifier/HTTP URL specified", and its file_path's download 404."""
        with self._lock:
            stored = self._data.files.files.get(file_id)
            if stored is None:
                raise ValueError(f"no file {file_id!r} to forget")
            stored.forgotten = True

    @property
    def holds(self) -> Holds:
        """Telegram slow for one chat: `holds.hold("sendMessage", chat_id)`, then `holds.release(...)`."""
        return self._holds

    # --- what the bot did -----------------------------------------------------------------------

    def sent_messages(self, chat_id: int | None = None) -> list[SentMessage]:
        with self._lock:
            return [m for m in self._data.sent if chat_id is None or m.chat_id == chat_id]

    def sent_files(self, chat_id: int | None = None) -> list[SentFile]:
        """Successful sendDocument and sendPhoto calls, in order (not in sent_messages)."""
        with self._lock:
            return [f for f in self._data.files.sent if chat_id is None or f.chat_id == chat_id]

    def downloads(self, file_id: str | None = None) -> list[FileDownload]:
        """Requests for known files' URLs, in order, with the fault each got."""
        with self._lock:
            return [d for d in self._data.files.downloads if file_id is None or d.file_id == file_id]

    def file_bytes(self, file_id: str) -> bytes | None:
        """What the fake keeps under a file_id (forgotten ones too); None if it never had it."""
        with self._lock:
            stored = self._data.files.files.get(file_id)
            return stored.data if stored is not None else None

    def edits(self, chat_id: int | None = None) -> list[Edit]:
        """Successful editMessageText calls, in order, with their times."""
        with self._lock:
            return [e for e in self._data.edits if chat_id is None or e.chat_id == chat_id]

    def drafts(self, chat_id: int | None = None) -> list[Draft]:
        """Successful sendMessageDraft calls, in order, with their times."""
        with self._lock:
            return [d for d in self._data.drafts if chat_id is None or d.chat_id == chat_id]

    def chat_actions(self, chat_id: int | None = None) -> list[ChatAction]:
        with self._lock:
            return [a for a in self._data.actions if chat_id is None or a.chat_id == chat_id]

    def requests(self, method: str | None = None) -> list[ApiCall]:
        """Every call with the right token, in order; `method` in canonical spelling."""
        with self._lock:
            return [c for c in self._data.calls if method is None or c.method == method]

    def call_count(self, method: str) -> int:
        with self._lock:
            return self._data.call_counts[method]

    def call_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._data.call_counts)

    def message(self, chat_id: int, message_id: int) -> JsonDict | None:
        """A message as it stands now (after edits); None once deleted or never sent."""
        with self._lock:
            return copy.deepcopy(self._data.stored(chat_id, message_id))

    def pending_updates(self) -> list[JsonDict]:
        """Updates not yet confirmed by a getUpdates offset."""
        with self._lock:
            return self._data.pending(len(self._data.updates))

    def bot_commands(self, scope: JsonDict | None = None, language_code: str = "") -> list[JsonDict]:
        with self._lock:
            params = Params({"scope": scope, "language_code": language_code})
            return copy.deepcopy(self._data.commands.get(BotApi.commands_key(params), []))

    # --- waiting (event-driven; callable from any loop or thread) -------------------------------

    async def wait_until(self, predicate: Callable[[], T | None], timeout_seconds: float = DEFAULT_WAIT_SECONDS) -> T:
        """The predicate's first non-None value, re-checked after every change; it may call accessors."""
        return await self._watch.wait_for(predicate, timeout_seconds)

    async def wait_for_messages(
        self, chat_id: int, count: int = 1, timeout_seconds: float = DEFAULT_WAIT_SECONDS
    ) -> list[SentMessage]:
        """All messages sent to the chat once there are at least `count`."""
        try:
            return await self.wait_until(lambda: _at_least(self.sent_messages(chat_id), count), timeout_seconds)
        except TimeoutError:
            texts = [m.plain_text for m in self.sent_messages(chat_id)]
            raise _timed_out(f"{count} message(s) to chat {chat_id}", timeout_seconds, texts) from None

    async def wait_for_files(
        self, chat_id: int, count: int = 1, timeout_seconds: float = DEFAULT_WAIT_SECONDS
    ) -> list[SentFile]:
        """All files sent to the chat (sendDocument, sendPhoto) once there are at least `count`."""
        try:
            return await self.wait_until(lambda: _at_least(self.sent_files(chat_id), count), timeout_seconds)
        except TimeoutError:
            got = [(f.method, f.file_name) for f in self.sent_files(chat_id)]
            raise _timed_out(f"{count} file(s) to chat {chat_id}", timeout_seconds, got) from None

    async def wait_for_chat_actions(
        self, chat_id: int, count: int = 1, timeout_seconds: float = DEFAULT_WAIT_SECONDS
    ) -> list[ChatAction]:
        try:
            return await self.wait_until(lambda: _at_least(self.chat_actions(chat_id), count), timeout_seconds)
        except TimeoutError:
            got = len(self.chat_actions(chat_id))
            raise _timed_out(f"{count} chat action(s) in chat {chat_id}", timeout_seconds, got) from None

    async def wait_for_requests(
        self, method: str, count: int = 1, timeout_seconds: float = DEFAULT_WAIT_SECONDS
    ) -> list[ApiCall]:
        """E.g. wait_for_requests("getUpdates", 2): the bot is polling (its first poll has returned)."""
        try:
            return await self.wait_until(lambda: _at_least(self.requests(method), count), timeout_seconds)
        except TimeoutError:
            raise _timed_out(f"{count} {method} call(s)", timeout_seconds, self.call_count(method)) from None


def _timed_out(expected: str, timeout_seconds: float, got: object) -> TimeoutError:
    return TimeoutError(f"expected {expected} within {timeout_seconds} s; got {got}")


def _at_least(items: list[T], count: int) -> list[T] | None:
    return items if len(items) >= count else None
