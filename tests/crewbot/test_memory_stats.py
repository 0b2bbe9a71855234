"""The notes and the history index in `crewbot stats` (the real command, on a real store) and in the metrics (a
scrape of the real metrics server reads them from the store)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from core.store import ChatStore, Database, MessageStore, NewMessage
from core.store.notes import NewNote, NoteStore
from crewbot.memory_stats import MemoryGauges, measure
from crewbot.metrics_server import MetricsServer
from tests.crewbot.cli_env import crewbot_env, run_crewbot

CHAT, OTHER = -4201, -4202


async def seeded(path: Path) -> Database:
    db = await Database.open(path)
    for chat in (CHAT, OTHER):
        await ChatStore(db).ensure(chat, "group", "t")
    for n in range(300):
        await MessageStore(db).add(NewMessage(CHAT, "Ann", f"message number {n} about the venue and lunch"))
    notes = NoteStore(db)
    await notes.add(NewNote(CHAT, "venue is the Old Mill", 1, "Ann"), 50)
    await notes.add(NewNote(CHAT, "Ann is in Tokyo", 1, "Ann", about_user_id=1), 20)
    await notes.add(NewNote(OTHER, "other", 1, "Ann"), 50)
    await notes.set_off(OTHER, True, "Ada")
    return db


async def test_crewbot_stats_shows_notes_and_the_index(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = await seeded(data / "crewbot.sqlite3")
    use = await measure(db)
    await db.close()
    assert (use.chat_notes, use.member_notes, use.chats_off, use.messages) == (2, 1, 1, 300)
    assert use.index_bytes > 0 and use.messages_bytes > 0
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = crewbot_env(data)

    done = run_crewbot(["stats", "--since", "1h", "--json"], env, cwd)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["memory"] == {
        "chat_notes": 2,
        "member_notes": 1,
        "chats_off": 1,
        "messages": 300,
        "messages_bytes": use.messages_bytes,
        "index_bytes": use.index_bytes,
    }
    done = run_crewbot(["stats", "--since", "1h", "--chat", str(CHAT)], env, cwd)
    assert done.returncode == 0, done.stderr
    assert "memory: 1 chat notes, 1 member notes\n" in done.stdout
    assert "history index: " in done.stdout and " for 300 messages (" in done.stdout


async def test_a_scrape_reads_the_notes_and_the_index_size(tmp_path: Path) -> None:
    db = await seeded(tmp_path / "crewbot.sqlite3")
    registry = CollectorRegistry()
    gauges = MemoryGauges(registry, db)

    async def ready() -> str | None:
        return None

    server = MetricsServer(registry, "127.0.0.1:0", ready, refresh=gauges.refresh)
    await server.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/metrics") as response,
        ):
            body = await response.text()
    finally:
        await server.stop()
        await db.close()

    assert 'crewbot_memory_notes{kind="chat"} 2.0' in body
    assert 'crewbot_memory_notes{kind="member"} 1.0' in body
    assert "crewbot_memory_chats_off 1.0" in body
    index_bytes = registry.get_sample_value("crewbot_history_index_bytes", {})
    assert index_bytes is not None and index_bytes > 0
