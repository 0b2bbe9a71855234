"""Polling that ends by itself (a bug, a revoked token) leaves a bot that answers nobody: /readyz fails at
once, the bot stops, and the command exits non-zero (a crash, not "cannot start"), so a supervisor
restarts it. Real PTB against the fake Telegram, in process and as the real command."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from telegram import Update

from bot.channels.polling import Poller
from bot.channels.telegram import TelegramChannel
from crewbot.app import App
from crewbot.operations import Operations
from crewbot.serve import Crashed, serve
from tests.bot.helpers import RecordingChannel
from tests.crewbot.cli_env import COMMAND_WAIT_SECONDS, crewbot_env, start_crewbot
from tests.fakes.faults import Fault
from tests.fakes.memory_runtime import MemoryRuntime
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, POLL_TIMEOUT_SECONDS, make_settings, telegram_app

WAIT_SECONDS = 30.0
POLL_SECONDS = 0.1


class PollingBug(Exception):
    """Stands for a bug in the poller itself: nothing an update can be, which is handled."""


async def buggy_handling(self: Poller, update: Update) -> None:
    raise PollingBug("a bug in the poller")


async def test_readyz_fails_once_polling_died_and_the_stop_is_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Poller, "_handle_until_stored", buggy_handling)
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, METRICS_ADDR="127.0.0.1:0")
        async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
            ops = Operations(settings)
            await ops.open(app.stores)
            await ops.start(app.stores.db, app.channel)
            ops.ready = True
            try:
                assert ops.server is not None
                readyz = f"http://127.0.0.1:{ops.server.port}/readyz"
                async with http.get(readyz) as response:
                    assert response.status == 200

                tg.push_message(GROUP_ID, "hello")
                assert isinstance(app.channel, TelegramChannel)
                async with asyncio.timeout(WAIT_SECONDS):
                    failure = await app.channel.wait_receiving_failure()
                assert isinstance(failure, PollingBug)

                async with http.get(readyz) as response:
                    assert response.status == 503
                    assert (
                        "telegram stopped receiving messages (PollingBug: a bug in the poller)" in await response.text()
                    )
            finally:
                await ops.stop()
        # Leaving telegram_app stopped the channel: the failure, reported when it happened, is not raised again.


async def test_serve_stops_with_what_ended_polling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Poller, "_handle_until_stored", buggy_handling)
    async with FakeTelegram() as tg, MemoryRuntime() as runtime:
        settings = make_settings(tmp_path, tg)
        channel = TelegramChannel(tg.token, tg.base_url, poll_timeout_seconds=POLL_TIMEOUT_SECONDS)
        running = asyncio.create_task(serve(settings, channel, runtime))
        await tg.wait_for_requests("getUpdates", 1, WAIT_SECONDS)
        tg.push_message(GROUP_ID, "hello")
        with pytest.raises(Crashed) as crashed:
            async with asyncio.timeout(WAIT_SECONDS):
                await running
    assert isinstance(crashed.value.__cause__, PollingBug)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def readyz_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None  # not listening (yet, or any more)


def test_the_command_exits_non_zero_when_telegram_revokes_the_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    output = tmp_path / "stderr.txt"
    port = free_port()
    with FakeTelegram() as tg, output.open("w") as stderr:
        env = crewbot_env(
            data_dir,
            TELEGRAM_BOT_TOKEN=tg.token,
            TELEGRAM_API_BASE_URL=tg.base_url,
            ALLOWED_CHAT_IDS=str(GROUP_ID),
            METRICS_ADDR=f"127.0.0.1:{port}",
        )
        bot = start_crewbot(["-m", "crewbot", "run"], env, tmp_path, stderr)
        try:
            deadline = time.monotonic() + COMMAND_WAIT_SECONDS
            while readyz_status(port) != 200:
                assert bot.poll() is None, output.read_text()
                assert time.monotonic() < deadline, "the bot did not become ready in time"
                time.sleep(POLL_SECONDS)

            tg.fail_next("getUpdates", Fault.error(401, "Unauthorized"))
            tg.push_message(GROUP_ID, "hello")  # ends the long poll in flight: the next one meets the 401
            code = bot.wait(COMMAND_WAIT_SECONDS)
        finally:
            if bot.poll() is None:
                bot.kill()  # our own child, by its handle
                bot.wait()

    text = output.read_text()
    assert code == 1, text
    assert "cannot start" not in text and "could not start" not in text
    assert text.strip().splitlines()[-1].startswith("crewbot: stopped: Telegram rejected TELEGRAM_BOT_TOKEN")
    assert "polling_stopped" in text and "crewbot_crashed" in text
    assert tg.token not in text


async def test_a_failure_while_stopping_is_a_crash_not_a_failed_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop_app = App.stop

    async def stop_then_fail(app: App) -> None:
        await stop_app(app)  # everything closed, as a test must leave it
        raise PollingBug("stopping failed")

    monkeypatch.setattr(App, "stop", stop_then_fail)
    started = asyncio.Event()
    async with MemoryRuntime() as runtime:
        running = asyncio.create_task(
            serve(make_settings(tmp_path), RecordingChannel(), runtime, on_started=started.set)
        )
        async with asyncio.timeout(WAIT_SECONDS):
            await started.wait()
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler turns it into a stop
        with pytest.raises(Crashed) as crashed:
            async with asyncio.timeout(WAIT_SECONDS):
                await running
    assert isinstance(crashed.value.__cause__, PollingBug)
