"""The fake Telegram Bot API in a process of its own, driven over loopback HTTP.

For the ingest, memory, stall and files benchmarks: the server's work (and its memory: it keeps every update
and message) must not be counted as the bot's. `python -m bench.tg_process` prints `PORT <n>` and serves until
its stdin closes; `/control/push` takes `{"messages": [{"chat_id": .., "text": ..}]}`, `/control/chats` takes
`{"chat_ids": [..]}` (chats the bot is in, without a message) and `/control/sent` answers how many messages
the bot has sent. `/control/post` posts one message, a document (read from a local path) with the text as its
caption when it names a file, and answers when it was posted (`time.time()`); `/control/files` lists the
files the bot sent to a chat with when each was accepted (`time.time()`), and their sha256 if asked.
`/control/deliver` does what Telegram does in webhook mode: it POSTs users' messages as updates to a webhook
`url` with its `secret`, all at once over at most WEBHOOK_CONNECTIONS connections (Telegram's default
max_connections), and answers when each was sent and answered (`time.time()`) and the status.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

from bench.common import stop_child
from tests.fakes.telegram_server import DEFAULT_BOT_USERNAME, DEFAULT_TOKEN, FakeTelegram

CONTROL_PREFIX = "/control/"
WEBHOOK_CONNECTIONS = 40
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
START_TIMEOUT_SECONDS = 30.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ControlledFakeTelegram(FakeTelegram):
    """The tests' fake, plus control routes ahead of the Bot API ones."""

    _deliveries: aiohttp.ClientSession | None = None  # webhook POSTs, over kept-alive connections as Telegram's

    async def close_deliveries(self) -> None:
        if self._deliveries is not None:
            await self._deliveries.close()

    async def _deliver(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        for message in body["messages"]:
            self.push_message(int(message["chat_id"]), str(message["text"]))
        if self._deliveries is None:
            self._deliveries = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=WEBHOOK_CONNECTIONS))
        session, url, headers = self._deliveries, str(body["url"]), {SECRET_HEADER: str(body["secret"])}

        async def one(update: dict[str, Any]) -> dict[str, Any]:
            sent_at = time.time()
            async with session.post(url, json=update, headers=headers) as response:
                await response.read()
                return {
                    "text": update["message"]["text"],
                    "sent_at": sent_at,
                    "answered_at": time.time(),
                    "status": response.status,
                }

        return list(await asyncio.gather(*(one(update) for update in self.take_pending_updates())))

    def _build_app(self) -> web.Application:
        app = super()._build_app()
        app.middlewares.append(self._control)
        return app

    @web.middleware
    async def _control(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(CONTROL_PREFIX):
            return await handler(request)
        action = request.path.removeprefix(CONTROL_PREFIX)
        if action == "push":
            body = await request.json()
            pushed_at = time.time()
            for message in body["messages"]:
                self.push_message(int(message["chat_id"]), str(message["text"]))
            return web.json_response({"pushed": len(body["messages"]), "pushed_at": pushed_at})
        if action == "deliver":
            return web.json_response({"deliveries": await self._deliver(await request.json())})
        if action == "chats":
            body = await request.json()
            for chat_id in body["chat_ids"]:
                self.add_chat(int(chat_id), title=f"bench {chat_id}")
            return web.json_response({"added": len(body["chat_ids"])})
        if action == "post":
            body = await request.json()
            chat_id, text, file = int(body["chat_id"]), str(body["text"]), body.get("file")
            if file is None:
                self.push_message(chat_id, text)
            else:
                data = await asyncio.to_thread(Path(str(file)).read_bytes)
                self.push_media_message(chat_id, "document", data, file_name=str(body["file_name"]), caption=text)
            return web.json_response({"posted_at": time.time()})  # the update is queued for getUpdates
        if action == "files":
            files = self.sent_files(int(request.query["chat_id"]))
            to_wall = time.time() - time.monotonic()
            hashes = request.query.get("hashes") == "1"
            listed = [
                {
                    "method": f.method,
                    "file_name": f.file_name,
                    "size_bytes": len(f.data),
                    "accepted_at": f.at + to_wall,
                    "sha256": hashlib.sha256(f.data).hexdigest() if hashes else None,
                }
                for f in files
            ]
            return web.json_response({"files": listed})
        if action == "sent":
            chat = request.query.get("chat_id")
            sent = self.sent_messages(int(chat)) if chat is not None else self.sent_messages()
            return web.json_response({"sent": len(sent)})
        return web.json_response({"error": f"unknown control action {action!r}"}, status=404)


async def _serve() -> None:
    async with ControlledFakeTelegram() as tg:
        print(f"PORT {tg.port}", flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin (or dies)
        await tg.close_deliveries()


class TelegramProcess:
    """Starts the controlled fake in a child process; `async with` it, then push and count over HTTP."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self.token = DEFAULT_TOKEN
        self.bot_username = DEFAULT_BOT_USERNAME

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.tg_process", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), START_TIMEOUT_SECONDS)
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"the fake Telegram process did not start: {line!r}")
        self.port = int(line.split()[1])
        self._session = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{self.port}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
        if self._process is not None:
            await stop_child(self._process)

    async def _call(self, method: str, path: str, payload: Any = None) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.request(method, CONTROL_PREFIX + path, json=payload) as response:
            response.raise_for_status()
            data: dict[str, Any] = await response.json()
            return data

    async def push(self, messages: list[tuple[int, str]]) -> float:
        """Queued for getUpdates; when the first was (time.time())."""
        answer = await self._call("POST", "push", {"messages": [{"chat_id": c, "text": t} for c, t in messages]})
        return float(answer["pushed_at"])

    async def deliver(self, url: str, secret: str, messages: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """POSTed to the webhook as Telegram does, all at once: per update its text, sent_at, answered_at, status."""
        payload = {"url": url, "secret": secret, "messages": [{"chat_id": c, "text": t} for c, t in messages]}
        deliveries: list[dict[str, Any]] = (await self._call("POST", "deliver", payload))["deliveries"]
        return deliveries

    async def add_chats(self, chat_ids: list[int]) -> None:
        await self._call("POST", "chats", {"chat_ids": chat_ids})

    async def post(self, chat_id: int, text: str, file: Path | None = None, file_name: str = "") -> float:
        """A member's message, or a document with `text` as its caption; when it was posted (time.time())."""
        payload = {
            "chat_id": chat_id,
            "text": text,
            "file": None if file is None else str(file),
            "file_name": file_name,
        }
        return float((await self._call("POST", "post", payload))["posted_at"])

    async def files(self, chat_id: int, *, hashes: bool = False) -> list[dict[str, Any]]:
        """What the bot sent to the chat with sendDocument / sendPhoto, oldest first."""
        answer = await self._call("GET", f"files?chat_id={chat_id}&hashes={int(hashes)}")
        listed: list[dict[str, Any]] = answer["files"]
        return listed

    async def sent(self, chat_id: int | None = None) -> int:
        """Messages the bot has sent, to one chat or to all."""
        path = "sent" if chat_id is None else f"sent?chat_id={chat_id}"
        return int((await self._call("GET", path))["sent"])


if __name__ == "__main__":
    asyncio.run(_serve())
