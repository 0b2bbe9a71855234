"""The operator's MCP servers while the bot runs: the file read again when it changed (at the next turn or run),
one connection per server kept open, the tools a chat may use, and every call logged and counted.

Used by the main agent (its tools) and by the subagent side (the host calls a tool for a run); both ask for
the tools of one `Use`, and a call names a server and a tool, checked here against the config in force.
A file that became invalid is reported and the last valid one stays in force; no file: no servers.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.logging import get_logger
from core.mcp_client import MAX_RESULT_CHARS, CallOutcome, CallStatus, McpConnection, ServerUnavailable
from core.mcp_config import McpConfig, McpConfigError, McpServer, Use, load_config
from core.mcp_tool_list import OfferedTool
from core.store.mcp_calls import McpCallRow, McpCallStore

log = get_logger(__name__)

CallCounter = Callable[[str, str, CallOutcome], None]  # (server, tool, outcome): metrics, a run's records


@dataclass(frozen=True, slots=True)
class ChatTools:
    """What a chat's agent may use now, and which servers could not be reached for it (with why)."""

    tools: tuple[OfferedTool, ...]
    unavailable: tuple[tuple[str, str], ...] = ()  # (server, reason)

    def find(self, name: str) -> OfferedTool | None:
        return next((t for t in self.tools if t.name == name), None)


class McpServers:
    def __init__(
        self,
        path: Path | None,
        environ: Mapping[str, str] | None = None,
        on_call: CallCounter | None = None,
        store: McpCallStore | None = None,
    ) -> None:
        self._path = path
        self._environ = environ if environ is not None else os.environ
        self._on_call = on_call
        self._store = store  # a row per call for `crewbot stats`, written in the background
        self._writing: set[asyncio.Task[None]] = set()
        self._config = McpConfig()
        self._seen: tuple[int, int, int] | None = None  # the file's (inode, size, mtime_ns) last read
        self._problem: str | None = None
        self._loaded = False  # the file was looked at once (a call before any listing reads it first)
        self._connections: dict[str, McpConnection] = {}
        self._reloading = asyncio.Lock()

    @property
    def problem(self) -> str | None:
        """Why the file in force is not the one on disk (it does not parse, or cannot be read); None: it is."""
        return self._problem

    async def config(self) -> McpConfig:
        """The config in force, read again first if the file changed since it was last read."""
        if self._path is None:
            return self._config
        async with self._reloading:
            stamp = await asyncio.to_thread(_stamp, self._path)
            self._loaded = True
            if stamp == self._seen:
                return self._config
            self._seen = stamp
            try:
                config = await asyncio.to_thread(load_config, self._path, self._environ)
            except McpConfigError as exc:
                self._problem = str(exc)
                log.error("mcp_config_invalid", error=str(exc), kept=len(self._config.servers))
                return self._config
            self._problem = None
            await self._replace(config)
            return config

    async def tools_for(self, chat_id: int, use: Use) -> ChatTools:
        """The tools of every server enabled for the chat and that use; a server that fails is named, not fatal."""
        config = await self.config()
        servers = config.for_chat(chat_id, use)
        listed = await asyncio.gather(*(self._tools_of(server) for server in servers))
        tools = tuple(tool for tools, _ in listed for tool in tools)
        unavailable = tuple((s.name, reason) for s, (_, reason) in zip(servers, listed, strict=True) if reason)
        return ChatTools(tools, unavailable)

    async def call(
        self,
        chat_id: int,
        use: Use,
        server_name: str,
        tool: str,
        arguments: dict[str, Any],
        max_chars: int = MAX_RESULT_CHARS,
        run_id: str | None = None,
    ) -> CallOutcome:
        """Call one tool for a chat; refused (never raised) when the config in force does not allow it. The file
        is not read again here: the tools were listed from it at the turn's (or run's) start, by `tools_for`."""
        config = self._config if self._loaded else await self.config()
        server = config.named(server_name)
        if server is None or use not in server.use or not server.serves_chat(chat_id) or not server.allows_tool(tool):
            outcome = CallOutcome(CallStatus.REFUSED, f"The tool {server_name}__{tool} is not available here.", 0, 0.0)
        else:
            outcome = await self._connection(server).call(tool, arguments, max_chars)
        self.record(chat_id, server_name, tool, outcome, run_id)
        return outcome

    def record(self, chat_id: int, server: str, tool: str, outcome: CallOutcome, run_id: str | None = None) -> None:
        """A call's log line and count (also for calls refused before they reached a server)."""
        log.info(
            "mcp_tool_call",
            chat_id=chat_id,
            run_id=run_id,
            server=server[:40],
            tool=tool[:80],
            outcome=outcome.status.value,
            seconds=round(outcome.seconds, 3),
            result_chars=outcome.result_chars,
        )
        if self._on_call is not None:
            self._on_call(server[:40], tool[:80], outcome)
        if self._store is not None:
            row = McpCallRow(
                chat_id,
                time.time(),
                server[:40],
                tool[:80],
                outcome.status.value,
                outcome.seconds,
                outcome.result_chars,
                run_id,
            )
            task = asyncio.create_task(self._store_one(self._store, row), name="mcp-call-row")
            self._writing.add(task)
            task.add_done_callback(self._writing.discard)

    async def _store_one(self, store: McpCallStore, row: McpCallRow) -> None:
        try:
            await store.add(row)
        except Exception as exc:  # statistics only: never a failure of the call
            log.warning("mcp_call_not_stored", server=row.server, error=str(exc))

    async def close(self) -> None:
        """The servers' sessions (and stdio servers' processes) end; the calls' rows are written first."""
        await asyncio.gather(*self._writing, return_exceptions=True)
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    def _connection(self, server: McpServer) -> McpConnection:
        connection = self._connections.get(server.name)
        if connection is None:
            connection = self._connections[server.name] = McpConnection(server)
        return connection

    async def _tools_of(self, server: McpServer) -> tuple[tuple[OfferedTool, ...], str | None]:
        try:
            return await self._connection(server).tools(), None
        except ServerUnavailable as exc:
            log.warning("mcp_server_unavailable", server=server.name, error=str(exc))
            return (), str(exc)

    async def _replace(self, config: McpConfig) -> None:
        """The new config in force; connections of servers removed or changed are closed."""
        stale = [
            name
            for name, connection in self._connections.items()
            if config.named(name) != connection.server  # removed, or any of its keys changed
        ]
        closing = [self._connections.pop(name) for name in stale]
        self._config = config
        log.info("mcp_config_loaded", servers=[s.name for s in config.servers], restarted=stale)
        await asyncio.gather(*(c.close() for c in closing), return_exceptions=True)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
