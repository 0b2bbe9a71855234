"""`/tools`: the chat's MCP tools by name, servers that cannot be reached named, nothing of their configuration."""

from __future__ import annotations

from pathlib import Path

from bot.tools_command import NO_SERVERS, tools_reply
from core.mcp_servers import McpServers
from tests.mcp_helpers import stdio_entry, write_config

CHAT = 42


async def test_tools_lists_the_chats_tools_and_names_what_is_down(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "mcp.json",
        {
            "notes": stdio_entry(tools=["echo", "add"], env={"NOTES_TOKEN": "${T}"}),
            "other": stdio_entry(chats=[7]),
            "down": {"command": "/nonexistent/mcp-server", "args": ["--flag"]},
        },
    )
    hub = McpServers(path, {"T": "tok-secret-1234"}, list_wait_seconds=120)
    try:
        reply = await tools_reply(hub, CHAT)
    finally:
        await hub.close()
    assert reply.startswith("MCP tools I can use here (2):")
    assert "• notes__echo: Return the text as it was given." in reply
    assert "• notes__add: Add two integers." in reply
    assert "other__" not in reply
    assert "⚠ down: cannot be reached now" in reply
    for hidden in ("tok-secret-1234", "nonexistent", "--flag", "NOTES_TOKEN", "mcp_server"):
        assert hidden not in reply


async def test_no_servers(tmp_path: Path) -> None:
    assert await tools_reply(None, CHAT) == NO_SERVERS
    hub = McpServers(write_config(tmp_path / "mcp.json", {"s": stdio_entry(chats=[7])}), {}, list_wait_seconds=120)
    assert await tools_reply(hub, CHAT) == NO_SERVERS
    await hub.close()
