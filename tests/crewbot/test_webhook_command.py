"""The real `crewbot run` in webhook mode: it sets the webhook, takes an update POSTed to its listener as
Telegram sends it, answers it, stops cleanly on SIGTERM leaving the webhook set; a listener it cannot open is
one line on the terminal. The fake Bot API runs on a thread; the bot is a process of its own."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.bot.channels.webhook_helpers import SECRET, SECRET_HEADER, URL, free_port
from tests.crewbot.cli_env import COMMAND_WAIT_SECONDS, crewbot_env, run_crewbot, start_crewbot, until_logged
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID

POLL_SECONDS = 0.1


def post_update(port: int, update: dict[str, object]) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/telegram",
        data=json.dumps(update).encode(),
        headers={"Content-Type": "application/json", SECRET_HEADER: SECRET},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_crewbot_run_in_webhook_mode_answers_a_posted_update_and_stops_cleanly(tmp_path: Path) -> None:
    output = tmp_path / "stderr.txt"
    port = free_port()
    with FakeTelegram() as tg, output.open("w") as stderr:
        env = crewbot_env(
            tmp_path / "data",
            TELEGRAM_BOT_TOKEN=tg.token,
            TELEGRAM_API_BASE_URL=tg.base_url,
            ALLOWED_CHAT_IDS=str(GROUP_ID),
            MERGE_WINDOW_SECONDS="0",
            TELEGRAM_WEBHOOK_URL=URL,
            TELEGRAM_WEBHOOK_SECRET=SECRET,
            TELEGRAM_WEBHOOK_LISTEN=f"127.0.0.1:{port}",
        )
        bot = start_crewbot(["-m", "crewbot", "run"], env, tmp_path, stderr)
        try:
            until_logged(bot, output, "crewbot_started")
            assert tg.webhook.url == URL and tg.webhook.secret_token == SECRET

            tg.push_message(GROUP_ID, f"@{tg.bot_username} are you there?")
            [update] = tg.take_pending_updates()
            assert post_update(port, update) == 200
            deadline = time.monotonic() + COMMAND_WAIT_SECONDS
            while not tg.sent_messages(GROUP_ID):
                assert time.monotonic() < deadline, "no reply in time"
                time.sleep(POLL_SECONDS)

            bot.send_signal(signal.SIGTERM)  # our own child, by its handle
            code = bot.wait(COMMAND_WAIT_SECONDS)
        finally:
            if bot.poll() is None:
                bot.kill()
                bot.wait()
        assert tg.webhook.url == URL and tg.call_count("deleteWebhook") == 0  # kept for the next start
        assert tg.call_count("getUpdates") == 0

    text = output.read_text()
    assert code == 0, text
    assert "webhook_set" in text and "mode=webhook" in text
    assert SECRET not in text and tg.token not in text


def test_a_listen_address_in_use_is_one_line_at_start(tmp_path: Path) -> None:
    with socket.socket() as taken, FakeTelegram() as tg:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = crewbot_env(
            tmp_path / "data",
            TELEGRAM_BOT_TOKEN=tg.token,
            TELEGRAM_API_BASE_URL=tg.base_url,
            TELEGRAM_WEBHOOK_URL=URL,
            TELEGRAM_WEBHOOK_SECRET=SECRET,
            TELEGRAM_WEBHOOK_LISTEN=f"127.0.0.1:{port}",
        )
        done = run_crewbot(["run"], env, tmp_path)

    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"crewbot: cannot start: cannot listen on TELEGRAM_WEBHOOK_LISTEN=127.0.0.1:{port} (")
    assert line.endswith("choose another TELEGRAM_WEBHOOK_LISTEN and point the proxy at it")
    assert SECRET not in done.stderr + done.stdout
