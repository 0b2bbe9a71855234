"""`crewbot config show` and `crewbot config set NAME=VALUE ...`: the running bot's settings, changed live.

Both talk to the bot through its control socket (crewbot/control.py). With no bot running, `show` reads
the environment, `.env` and the overrides stored in the database itself; `set` needs the bot, since a
change is validated and applied by it.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp

from core.live_config import LiveConfig, parse_assignments
from core.settings import Settings
from core.store.db import Database
from core.store.setting_overrides import SettingOverrideStore
from crewbot.control import control_socket_path

EXIT_REFUSED = 1
EXIT_NO_BOT = 3
REQUEST_TIMEOUT_SECONDS = 30.0


async def _call(settings: Settings, method: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    path = control_socket_path(settings.data_dir)
    connector = aiohttp.UnixConnector(path=str(path))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.request(method, "http://crewbot/config", json=body) as response,
    ):
        return response.status, await response.json()


def _bot_running(settings: Settings) -> bool:
    return control_socket_path(settings.data_dir).is_socket()


async def _local_rows(settings: Settings) -> list[dict[str, Any]]:
    db = await Database.open(settings.db_path)
    try:
        config = LiveConfig(settings, SettingOverrideStore(db))
        await config.load()
        rows = await config.effective()
    finally:
        await db.close()
    return [{"name": r.name, "value": r.value, "source": r.source.value, "live": r.live} for r in rows]


async def show_config(settings: Settings) -> int:
    rows: list[dict[str, Any]]
    note = ""
    try:
        _, answer = await _call(settings, "GET") if _bot_running(settings) else (0, {})
        rows = answer["settings"]
    except (aiohttp.ClientError, OSError, KeyError):
        rows = await _local_rows(settings)
        note = "(no bot answers on this DATA_DIR: values as the next start would have them)"
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        mark = "*" if row["live"] else " "
        print(f"{row['name']:<{width}} {mark} {row['value']!s:<24} {row['source']}")
    print("* changeable on the running bot: crewbot config set NAME=VALUE")
    if note:
        print(note)
    return 0


async def set_config(settings: Settings, assignments: list[str]) -> int:
    try:
        changes = parse_assignments(assignments)
    except ValueError as exc:
        print(f"crewbot: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        status, answer = await _call(settings, "POST", {"changes": changes})
    except (aiohttp.ClientError, OSError) as exc:
        print(
            f"crewbot: no bot answers at {control_socket_path(settings.data_dir)} ({exc}): start it "
            "(`crewbot run`), or check DATA_DIR; a live change is made by the running bot",
            file=sys.stderr,
        )
        return EXIT_NO_BOT
    for applied in answer.get("applied", []):
        print(f"{applied['name']}: {applied['old']} -> {applied['new']} (from the next run's start; persisted)")
    for line in answer.get("errors", []):
        print(f"crewbot: {line}", file=sys.stderr)
    return 0 if status == 200 else EXIT_REFUSED
