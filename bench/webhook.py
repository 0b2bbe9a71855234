"""Webhook mode against long polling: from Telegram having an update to the update stored, in the same run.

Two apps in this process, each the real `crewbot.app.App` (real PTB, SQLite, router; offline model) with its
own DATA_DIR and its own fake Bot API in a process of its own (bench/tg_process.py: one token is one mode):
- *polling*: the product's long polling (10 s polls, as in production). **Start**: the update queued in its
  fake (`/control/post`'s time). The fake's long poll answers at once, PTB reads the batch, the poller hands
  the update over;
- *webhook*: webhook mode, its listener on 127.0.0.1. **Start**: the fake POSTs the update to the listener as
  Telegram does (`/control/deliver`: the secret header, kept-alive connections, at most 40 at once), the time
  just before it sends. The listener checks the secret, reads and parses the body, hands the update over and
  answers 200 once it returned.
**Stop** (both): the router's MessageStore.add returned for that update (a tap on the app's store, time.time();
both processes read the same clock). The messages mention nobody (no turn runs), in allowed chats. Also timed:
webhook POST → its 200 at the fake (stored, then answered), against the same POST to a bare aiohttp handler in
this process answering 200 at once (the HTTP floor); and 100 updates over 50 chats at once → all stored, each way.
One update per arm per round, the order alternating; `gc.freeze()` after start-up, as crewbot/serve.py does.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bench.common import BenchContext, bench_settings, ms
from bench.report import Measure, Row
from bench.tg_process import TelegramProcess
from bot.channels.telegram import TelegramChannel
from bot.channels.webhook import WebhookConfig
from core.store.messages import MessageStore, NewMessage
from core.stores import Stores
from crewbot.app import App

NAME = "webhook"
SECRET = "bench-webhook-secret_0123456789"
URL = "https://bot.example.test/telegram"
WARMUP_ROUNDS = 20
BURST = 100
BURST_CHATS = 50
WAIT_SECONDS = 30.0
POLLING_LABEL = "polling: update queued in the fake Bot API → stored (getUpdates' pickup), same round"


class StoredTap:
    """When the router's MessageStore.add returned for each message (by its text): an instance attribute
    shadows the method for the router, which holds this same store."""

    def __init__(self, messages: MessageStore) -> None:
        self._add = messages.add
        self.at: dict[str, float] = {}
        self._changed = asyncio.Event()
        setattr(messages, "add", self)  # noqa: B010

    async def __call__(self, message: NewMessage) -> int | None:
        row = await self._add(message)
        self.at[message.content] = time.time()
        self._changed.set()
        return row

    async def wait(self, texts: list[str]) -> list[float]:
        async with asyncio.timeout(WAIT_SECONDS):
            while any(text not in self.at for text in texts):
                self._changed.clear()
                await self._changed.wait()
        return [self.at[text] for text in texts]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def _app(ctx: BenchContext, tg: TelegramProcess, key: str, webhook: bool) -> AsyncIterator[tuple[StoredTap, str]]:
    """The app on its fake, its store tapped; and in webhook mode its listener's URL ("" when polling)."""
    extra: dict[str, Any] = {}
    if webhook:
        extra = {
            "TELEGRAM_WEBHOOK_URL": URL,
            "TELEGRAM_WEBHOOK_SECRET": SECRET,
            "TELEGRAM_WEBHOOK_LISTEN": f"127.0.0.1:{_free_port()}",
        }
    settings = bench_settings(
        ctx.work_dir / key, token=tg.token, base_url=tg.base_url, ALLOW_ALL_CHATS=True, STATUS_CARD="false", **extra
    )
    assert settings.telegram_bot_token is not None
    stores = await Stores.open(settings)
    channel = TelegramChannel(
        settings.telegram_bot_token.get_secret_value(),
        settings.telegram_api_base_url,
        webhook=WebhookConfig.of(settings),
    )
    app = App(settings, channel, stores)
    try:
        await app.start()
    except BaseException:
        await app.stop()
        raise
    try:
        yield StoredTap(stores.messages), f"http://{settings.telegram_webhook_listen}/telegram" if webhook else ""
    finally:
        await app.stop()


@asynccontextmanager
async def _bare_server() -> AsyncIterator[str]:
    """A POST handler answering 200 at once, on this process's loop: the HTTP round trip alone."""

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_post("/telegram", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/telegram"
    finally:
        await runner.cleanup()


@dataclass(slots=True)
class _Bench:
    tg_poll: TelegramProcess
    tg_hook: TelegramProcess
    polled: StoredTap
    hooked: StoredTap
    hook_url: str
    chat: int
    polled_ms: list[float] = field(default_factory=list)
    posted_ms: list[float] = field(default_factory=list)
    answered_ms: list[float] = field(default_factory=list)
    after_stored_ms: list[float] = field(default_factory=list)
    bare_ms: list[float] = field(default_factory=list)
    burst_polled_ms: list[float] = field(default_factory=list)
    burst_posted_ms: list[float] = field(default_factory=list)

    async def poll_one(self, index: int, keep: bool) -> None:
        text = f"polling {index}"
        queued_at = await self.tg_poll.post(self.chat, text)
        [stored_at] = await self.polled.wait([text])
        if keep:
            self.polled_ms.append(ms(stored_at - queued_at))

    async def post_one(self, index: int, keep: bool) -> None:
        text = f"webhook {index}"
        [delivery] = await self.tg_hook.deliver(self.hook_url, SECRET, [(self.chat, text)])
        if delivery["status"] != 200:
            raise RuntimeError(f"the listener answered {delivery['status']}")
        [stored_at] = await self.hooked.wait([text])
        if keep:
            self.posted_ms.append(ms(stored_at - delivery["sent_at"]))
            self.answered_ms.append(ms(delivery["answered_at"] - delivery["sent_at"]))
            self.after_stored_ms.append(ms(delivery["answered_at"] - stored_at))

    async def bare_one(self, bare_url: str, index: int, keep: bool) -> None:
        [delivery] = await self.tg_hook.deliver(bare_url, SECRET, [(self.chat, f"bare {index}")])
        if keep:
            self.bare_ms.append(ms(delivery["answered_at"] - delivery["sent_at"]))

    async def bursts(self, chats: list[int], index: int) -> None:
        batch = [(chats[k % len(chats)], f"burst {index} {k}") for k in range(BURST)]
        polling = [(chat, f"polling {text}") for chat, text in batch]
        queued_at = await self.tg_poll.push(polling)
        stored = await self.polled.wait([text for _, text in polling])
        self.burst_polled_ms.append(ms(max(stored) - queued_at))
        webhook = [(chat, f"webhook {text}") for chat, text in batch]
        deliveries = await self.tg_hook.deliver(self.hook_url, SECRET, webhook)
        if len(deliveries) != BURST or any(d["status"] != 200 for d in deliveries):
            raise RuntimeError(
                f"burst: {len(deliveries)} delivered, statuses {sorted({d['status'] for d in deliveries})}"
            )
        stored = await self.hooked.wait([text for _, text in webhook])
        self.burst_posted_ms.append(ms(max(stored) - min(d["sent_at"] for d in deliveries)))


async def run(ctx: BenchContext) -> list[Row]:
    rounds, bursts = ctx.scaled(300, 60), ctx.scaled(5, 2)
    async with (
        TelegramProcess() as tg_poll,
        TelegramProcess() as tg_hook,
        _bare_server() as bare_url,
        _app(ctx, tg_poll, "polling", webhook=False) as (polled, _),
        _app(ctx, tg_hook, "webhook", webhook=True) as (hooked, hook_url),
    ):
        bench = _Bench(tg_poll, tg_hook, polled, hooked, hook_url, ctx.chat_id(0))
        gc.collect()
        gc.freeze()  # as crewbot/serve.py does once the bot has started
        try:
            for index in range(WARMUP_ROUNDS + rounds):
                keep = index >= WARMUP_ROUNDS
                if index % 2 == 0:
                    await bench.poll_one(index, keep)
                    await bench.post_one(index, keep)
                else:
                    await bench.post_one(index, keep)
                    await bench.poll_one(index, keep)
                await bench.bare_one(bare_url, index, keep)
            chats = [ctx.chat_id(1 + k) for k in range(BURST_CHATS)]
            for index in range(bursts):
                await bench.bursts(chats, index)
        finally:
            gc.unfreeze()
    ctx.note(
        f"{rounds} rounds after {WARMUP_ROUNDS} warm-up, one update per arm each, the order alternating; "
        f"{bursts} bursts of {BURST} updates over {BURST_CHATS} chats per arm; messages mention nobody (no turns)"
    )
    return _rows(bench)


def _rows(b: _Bench) -> list[Row]:
    return [
        Row(
            NAME,
            "webhook: update POSTed to the listener → stored",
            "ms",
            Measure.of(b.posted_ms),
            POLLING_LABEL,
            Measure.of(b.polled_ms),
        ),
        Row(
            NAME,
            "webhook: update POSTed → its 200 at the sender (stored, then answered)",
            "ms",
            Measure.of(b.answered_ms),
            "the same POST to a bare aiohttp handler answering 200 at once, same round",
            Measure.of(b.bare_ms),
        ),
        Row(NAME, "webhook: stored → the 200 at the sender", "ms", Measure.of(b.after_stored_ms)),
        Row(
            NAME,
            f"webhook: {BURST} updates over {BURST_CHATS} chats POSTed at once (40 connections) → all stored",
            "ms",
            Measure.of(b.burst_posted_ms),
            f"polling: the same {BURST} queued at once → all stored, same round",
            Measure.of(b.burst_polled_ms),
        ),
    ]
