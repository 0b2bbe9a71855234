"""The operator's MCP servers while the bot runs: the file read again when it changed (at the next turn or run),
one connection per server kept open, the tools a chat may use, and every call logged and counted.

Used by the main agent (its tools) and by the subagent side (the host calls a tool for a run); both ask for
the tools of one `Use`, and a call names a server and a tool, checked here against the config in force.
A file that became invalid is reported and the last valid one stays in force; no file (deleted, or missing at
start-up) or an empty one: no servers, and a missing file is reported.

A server's tool list is fetched in the background: a turn, `/tools` or a run's opening waits for it at most
LIST_WAIT_SECONDS, then goes on with the last list known (or without the server); a server that failed is not
tried again before its backoff, so a hung or dead server costs each turn that bound at most, and most none.
`chats` names platform chats (as ALLOWED_CHAT_IDS does): a forum topic of a listed chat is served too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.backoff import backoff_seconds
from core.logging import get_logger
from core.mcp_client import MAX_RESULT_CHARS, CallOutcome, CallStatus, McpConnection, ServerUnavailable
from core.mcp_config import McpConfig, McpConfigError, McpServer, Use, load_config
from core.mcp_tool_list import OfferedTool, SchemaChecks
from core.store.mcp_calls import McpCallRow, McpCallStore

log = get_logger(__name__)

CallCounter = Callable[[str, str, CallOutcome], None]  # (server, tool, outcome): metrics, a run's records
PlatformOf = Callable[[int], Awaitable[int]]  # a conversation's platform chat (a forum topic's group)
LIST_WAIT_SECONDS = 3.0  # the longest a turn, /tools or a run's opening waits for one server's tool list
LIST_RETRY_FIRST_SECONDS = 10.0  # after a server's list failed, before it is tried again; doubling to
LIST_RETRY_MAX_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class ChatTools:
    """What a chat's agent may use now, and which servers could not be reached for it (with why)."""

    tools: tuple[OfferedTool, ...]
    unavailable: tuple[tuple[str, str], ...] = ()  # (server, reason)

    def find(self, name: str) -> OfferedTool | None:
        return next((t for t in self.tools if t.name == name), None)


@dataclass(slots=True)
class _Listing:
    """A server's tool list as last fetched, and its fetch in the background."""

    tools: tuple[OfferedTool, ...] = ()
    known: bool = False
    failures: int = 0  # in a row
    reason: str | None = None  # of the last failure
    retry_at: float = 0.0  # monotonic
    started: float = 0.0  # monotonic, of the fetch in flight
    task: asyncio.Task[None] | None = None


class McpServers:
    def __init__(
        self,
        path: Path | None,
        environ: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        on_call: CallCounter | None = None,
        store: McpCallStore | None = None,
        platform_of: PlatformOf | None = None,
        list_wait_seconds: float = LIST_WAIT_SECONDS,
    ) -> None:
        self._path = path
        # What `${VAR}` reads: a callable is called (in a thread) at each read of the file, so a variable added to
        # the env file counts at the next reload, as the file itself does.
        self._environ = environ if environ is not None else os.environ
        self._platform_of = platform_of
        self._list_wait_seconds = list_wait_seconds
        self._listings: dict[str, _Listing] = {}
        self._checks = SchemaChecks()
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
            if self._loaded and stamp == self._seen:
                return self._config
            self._loaded = True
            self._seen = stamp
            if stamp is None:  # deleted (or never there): no servers, as an operator removing the file means
                self._problem = f"MCP_SERVERS: {self._path} does not exist: no MCP servers are used"
                log.error("mcp_config_missing", path=str(self._path))
                await self._replace(McpConfig())
                return self._config
            try:
                config = await asyncio.to_thread(self._load, self._path)
            except McpConfigError as exc:
                self._problem = str(exc)
                log.error("mcp_config_invalid", error=str(exc), kept=len(self._config.servers))
                return self._config
            self._problem = None
            await self._replace(config)
            return config

    def _load(self, path: Path) -> McpConfig:
        environ = self._environ() if callable(self._environ) else self._environ
        return load_config(path, environ)

    async def tools_for(self, chat_id: int, use: Use) -> ChatTools:
        """The tools of every server enabled for the chat and that use; a server that fails is named, not fatal.
        Waits at most LIST_WAIT_SECONDS for any server (they are listed together)."""
        config = await self.config()
        ids = await self._ids(chat_id)
        servers = tuple(s for s in config.servers if use in s.use and any(s.serves_chat(i) for i in ids))
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
        still_wanted: Callable[[], bool] | None = None,
    ) -> CallOutcome:
        """Call one tool for a chat; refused (never raised) when the config in force does not allow it. The file
        is not read again here: the tools were listed from it at the turn's (or run's) start, by `tools_for`.
        Recorded however it ends, a cancelled call too (a turn aborted by a merge, a run stopped)."""
        started = time.monotonic()
        outcome: CallOutcome | None = None
        try:
            config = self._config if self._loaded else await self.config()
            server = config.named(server_name)
            ids = await self._ids(chat_id)
            allowed = server is not None and use in server.use and server.allows_tool(tool)
            if server is None or not allowed or not any(server.serves_chat(i) for i in ids):
                text = f"The tool {server_name}__{tool} is not available here."
                outcome = CallOutcome(CallStatus.REFUSED, text, 0, 0.0)
            else:
                outcome = await self._connection(server).call(tool, arguments, max_chars, still_wanted)
        finally:
            if outcome is None:
                outcome = CallOutcome(CallStatus.CANCELLED, "", 0, time.monotonic() - started)
            self.record(chat_id, server_name, tool, outcome, run_id)
        return outcome

    async def _ids(self, chat_id: int) -> tuple[int, ...]:
        """The ids `chats` may name the conversation by: its own and its platform chat's."""
        if self._platform_of is None:
            return (chat_id,)
        platform = await self._platform_of(chat_id)
        return (chat_id,) if platform == chat_id else (chat_id, platform)

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
        listings, self._listings = list(self._listings.values()), {}
        await _cancel([listing.task for listing in listings if listing.task is not None])
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    def _connection(self, server: McpServer) -> McpConnection:
        connection = self._connections.get(server.name)
        if connection is None:
            connection = self._connections[server.name] = McpConnection(server, self._checks)
        return connection

    async def _tools_of(self, server: McpServer) -> tuple[tuple[OfferedTool, ...], str | None]:
        """The server's tools as last known, and why it is not usable now (None: it is)."""
        connection = self._connection(server)
        listing = self._listings.setdefault(server.name, _Listing())
        if connection.listed and listing.known and listing.failures == 0:
            return listing.tools, None
        if listing.task is None and time.monotonic() >= listing.retry_at:
            listing.task = asyncio.create_task(self._list(server, connection, listing), name=f"mcp-list-{server.name}")
            listing.started = time.monotonic()
        if listing.task is not None:  # the bound counts from the fetch's start: a hung one costs later turns nothing
            left = listing.started + self._list_wait_seconds - time.monotonic()
            if left > 0:
                await asyncio.wait({listing.task}, timeout=left)
        if listing.failures:
            return listing.tools, listing.reason
        if not listing.known:
            return (), "it is starting; its tools are offered once it answers"
        return listing.tools, None

    async def _list(self, server: McpServer, connection: McpConnection, listing: _Listing) -> None:
        try:
            tools = await connection.tools()
        except Exception as exc:  # ServerUnavailable, or anything else: the server is tried again after a while
            listing.failures += 1
            listing.reason = str(exc) if isinstance(exc, ServerUnavailable) else type(exc).__name__
            wait = backoff_seconds(
                listing.failures, first_seconds=LIST_RETRY_FIRST_SECONDS, max_seconds=LIST_RETRY_MAX_SECONDS
            )
            listing.retry_at = time.monotonic() + wait
            log.warning("mcp_server_unavailable", server=server.name, error=listing.reason, retry_in_seconds=wait)
        else:
            listing.tools, listing.known, listing.failures, listing.reason, listing.retry_at = tools, True, 0, None, 0.0
        finally:
            listing.task = None

    async def _replace(self, config: McpConfig) -> None:
        """The new config in force; connections of servers removed or changed are closed."""
        stale = [
            name
            for name, connection in self._connections.items()
            if config.named(name) != connection.server  # removed, or any of its keys changed
        ]
        closing = [self._connections.pop(name) for name in stale]
        gone = [
            self._listings.pop(name) for name in list(self._listings) if config.named(name) is None or name in stale
        ]
        await _cancel([listing.task for listing in gone if listing.task is not None])
        self._config = config
        log.info("mcp_config_loaded", servers=[s.name for s in config.servers], restarted=stale)
        await asyncio.gather(*(c.close() for c in closing), return_exceptions=True)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
