"""MCP tool calls counted (issue 40 item 2): each call is a row in the store (core/mcp_servers.py, a real stdio
server), and `crewbot stats` shows how many, how they went and the busiest tools (crewbot/mcp_stats.py)."""

from __future__ import annotations

import json
from pathlib import Path

from core.mcp_config import Use
from core.mcp_servers import McpServers
from core.settings import load_settings
from core.store.db import Database
from core.store.mcp_calls import McpCallRow, McpCallStore
from crewbot.mcp_stats import compute_mcp
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.mcp_helpers import stdio_entry, write_config

CHAT = -1001


async def test_each_call_is_stored_and_crewbot_stats_shows_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = await Database.open(load_settings(_env_file=None, DATA_DIR=str(data)).db_path)
    servers = McpServers(
        write_config(tmp_path / "mcp.json", {"notes": stdio_entry(tools=["echo"], timeout_seconds=2)}),
        {},
        store=McpCallStore(db),
    )
    try:
        assert (await servers.call(CHAT, Use.MAIN, "notes", "echo", {"text": "a"})).text == "a"
        await servers.call(CHAT, Use.MAIN, "notes", "echo", {"text": "b"})
        await servers.call(CHAT, Use.MAIN, "notes", "add", {"a": 1, "b": 2})  # not in its `tools`: refused
    finally:
        await servers.close()  # the rows are written before it returns
        rows = await McpCallStore(db).since(0.0)
        await db.close()
    assert [(r.server, r.tool, r.outcome, r.chat_id) for r in rows] == [
        ("notes", "echo", "ok", CHAT),
        ("notes", "echo", "ok", CHAT),
        ("notes", "add", "refused", CHAT),
    ]

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = crewbot_env(data)
    done = run_crewbot(["stats", "--since", "1h", "--json"], env, cwd)
    assert done.returncode == 0, done.stderr
    mcp = json.loads(done.stdout)["mcp"]
    assert mcp["calls"] == 3 and mcp["outcomes"] == {"ok": 2, "refused": 1}
    assert mcp["tools"][0]["tool"] == "notes__echo" and mcp["tools"][0]["calls"] == 2
    done = run_crewbot(["stats", "--since", "1h"], env, cwd)
    assert "MCP tool calls: 3 (2 ok, 1 refused)" in done.stdout
    assert "  notes__echo: 2 calls, median " in done.stdout
    done = run_crewbot(["stats", "--since", "1h", "--chat", "42"], env, cwd)
    assert "MCP tool calls: none" in done.stdout


def test_busiest_tools_first_with_their_failures() -> None:
    rows = [McpCallRow(1, 0.0, "a", "x", "ok", 0.01, 1)] + [McpCallRow(1, 0.0, "b", "y", "timeout", 2.0, 0)] * 2
    use = compute_mcp(rows)
    assert [(t.tool, t.calls, t.failed) for t in use.tools] == [("b__y", 2, 2), ("a__x", 1, 0)]
    assert compute_mcp([]).calls == 0
