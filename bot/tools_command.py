"""`/tools`: what the chat's main agent can use from the operator's MCP servers now, and what cannot be reached.

Names and the first line of each description only: nothing of a server's configuration (its command line, URL,
environment or headers) is shown to the chat.
"""

from __future__ import annotations

from core.mcp_config import Use
from core.mcp_servers import McpServers

MAX_LISTED_TOOLS = 60  # in one reply; the rest are counted
MAX_SHOWN_DESCRIPTION_CHARS = 80
NO_SERVERS = "No MCP tools are set up for this chat (the operator adds MCP servers in the MCP_SERVERS file)."


async def tools_reply(servers: McpServers | None, chat_id: int) -> str:
    if servers is None:
        return NO_SERVERS
    found = await servers.tools_for(chat_id, Use.MAIN)
    if not found.tools and not found.unavailable:
        return NO_SERVERS
    lines = [f"MCP tools I can use here ({len(found.tools)}):"] if found.tools else ["No MCP tools can be used now."]
    for tool in found.tools[:MAX_LISTED_TOOLS]:
        about = tool.description.strip().split("\n", 1)[0][:MAX_SHOWN_DESCRIPTION_CHARS]
        lines.append(f"• {tool.name}" + (f": {about}" if about else ""))
    if len(found.tools) > MAX_LISTED_TOOLS:
        lines.append(f"… and {len(found.tools) - MAX_LISTED_TOOLS} more")
    for server, _ in found.unavailable:
        lines.append(f"⚠ {server}: cannot be reached now (the operator's `crewbot doctor` says why)")
    return "\n".join(lines)
