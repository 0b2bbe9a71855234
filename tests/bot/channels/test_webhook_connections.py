"""The webhook listener's connections over real sockets (bot/channels/webhook_guard.py): 200 idle ones get no
more than the cap, the held ones are closed at the head timeout, a head trickling in is cut, a kept-alive
connection is reused and then closed when idle, Telegram's updates are still answered, and each kind of
closing is logged once, the rest counted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import structlog
from telegram import Bot, Update

from bot.channels.webhook import SECRET_HEADER, WebhookConfig, WebhookListener
from bot.channels.webhook_guard import MAX_CONNECTIONS, TELEGRAM_MAX_CONNECTIONS, ConnectionLimits

SECRET = "test-webhook-secret_0123456789"
PATH = "/telegram"
CONFIG = WebhookConfig(f"https://bot.example.test{PATH}", SECRET, "127.0.0.1", 0)
WAIT_SECONDS = 20.0  # the generous upper bound of every wait; each ends at its event, much sooner
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def update(update_id: int) -> str:
    chat = {"id": 42, "type": "private"}
    return json.dumps({"update_id": update_id, "message": {"message_id": 1, "date": 0, "chat": chat, "text": "hi"}})


def request(body: bytes | str, *, keep_alive: bool = True) -> bytes:
    """A POST as Telegram sends it (through the proxy), the secret in its header."""
    data = body.encode() if isinstance(body, str) else body
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: bot.example.test\r\n{SECRET_HEADER}: {SECRET}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        + ("" if keep_alive else "Connection: close\r\n")
        + "\r\n"
    )
    return head.encode() + data


@asynccontextmanager
async def listening(limits: ConnectionLimits, handled: list[int]) -> AsyncIterator[WebhookListener]:
    async def handle(received: Update) -> None:
        handled.append(received.update_id)

    listener = WebhookListener(CONFIG, Bot("123456:TEST-token"), handle, limits)
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop()


async def connect(listener: WebhookListener) -> Stream:
    assert listener.port is not None
    return await asyncio.open_connection("127.0.0.1", listener.port)


async def closed_after(reader: asyncio.StreamReader, since: float) -> float:
    """Seconds from `since` until the listener closed the connection (end of stream, or a reset)."""
    try:
        while await asyncio.wait_for(reader.read(4096), WAIT_SECONDS):
            pass
    except ConnectionError:
        pass
    return asyncio.get_running_loop().time() - since


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP answer's status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_SECONDS)
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


def closings(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, str]]:
    return [(e["kind"], e["log_level"]) for e in logs if e["event"] == "webhook_connection_closed"]


def counts(logs: list[MutableMapping[str, Any]]) -> dict[str, int]:
    [entry] = [e for e in logs if e["event"] == "webhook_connections_closed"]
    return dict(entry["counts"])


async def test_200_idle_connections_get_the_cap_the_held_ones_end_at_the_head_timeout_updates_still_come_in() -> None:
    cap, head_timeout = 50, 2.0
    limits = ConnectionLimits(max_connections=cap, head_timeout_seconds=head_timeout, keepalive_seconds=1.0)
    handled: list[int] = []
    streams: list[Stream] = []
    loop = asyncio.get_running_loop()
    with structlog.testing.capture_logs() as logs:
        async with listening(limits, handled) as listener:
            try:
                since = loop.time()
                for _ in range(200):
                    streams.append(await connect(listener))
                waited = await asyncio.gather(*(closed_after(reader, since) for reader, _ in streams))
                # The held ones are closed no sooner than their deadline; the others were closed as they came.
                assert sum(seconds >= head_timeout for seconds in waited) >= cap
                assert listener.guard.closed == {"over_cap": 200 - cap, "head_timeout": cap}

                reader, writer = streams[0] = await connect(listener)  # the slots are free again
                writer.write(request(update(7), keep_alive=False))
                assert await answer(reader) == (200, b"ok\n")
                assert handled == [7]
            finally:
                for _, writer in streams:
                    writer.close()
    assert closings(logs) == [("over_cap", "warning"), ("head_timeout", "warning")]  # once each
    assert counts(logs) == {"over_cap": 200 - cap, "head_timeout": cap}


async def test_a_head_trickling_in_a_byte_a_second_is_cut_at_the_head_timeout() -> None:
    head_timeout = 2.0
    limits = ConnectionLimits(head_timeout_seconds=head_timeout, keepalive_seconds=1.0)
    handled: list[int] = []
    async with listening(limits, handled) as listener:
        reader, writer = await connect(listener)
        whole = request(update(8))  # from Telegram, had it arrived in time

        sent = 0

        async def trickle() -> None:
            nonlocal sent
            for byte in whole:
                writer.write(bytes([byte]))
                sent += 1
                await asyncio.sleep(1.0)

        trickling = asyncio.create_task(trickle())
        try:
            waited = await closed_after(reader, asyncio.get_running_loop().time())
        finally:
            trickling.cancel()
            writer.close()
        assert waited >= head_timeout
        assert sent < len(whole) // 2  # cut long before the head was whole
        assert listener.guard.closed == {"head_timeout": 1}
    assert handled == []


async def test_a_kept_alive_connection_is_reused_then_closed_once_idle_or_half_sent_past_the_keepalive() -> None:
    keepalive = 1.0
    limits = ConnectionLimits(head_timeout_seconds=10.0, keepalive_seconds=keepalive)
    handled: list[int] = []
    loop = asyncio.get_running_loop()
    with structlog.testing.capture_logs() as logs:
        async with listening(limits, handled) as listener:
            # Idle after its answers; then the next head sent in part.
            for first, half in ((1, b""), (3, request(update(5))[:20])):
                reader, writer = await connect(listener)
                try:
                    for update_id in (first, first + 1):  # Telegram reuses the connection for the next update
                        writer.write(request(update(update_id)))
                        assert await answer(reader) == (200, b"ok\n")
                    answered = loop.time()
                    writer.write(half)
                    assert await closed_after(reader, answered) >= keepalive
                finally:
                    writer.close()
            assert listener.guard.closed == {"keepalive": 2}
    assert handled == [1, 2, 3, 4]
    assert closings(logs) == [("keepalive", "info")]
    assert counts(logs) == {"keepalive": 2}


def test_the_cap_holds_what_setwebhook_asks_telegram_for_with_room_for_the_proxy() -> None:
    assert 1 <= TELEGRAM_MAX_CONNECTIONS <= 100  # Telegram's range for max_connections
    assert MAX_CONNECTIONS >= 2 * TELEGRAM_MAX_CONNECTIONS
