"""One connection to one MCP server, held open between calls, and a tool call through it, bounded.

The session lives in a task of its own (the SDK's transports must be entered and left in one task); callers
use it from any task. A server that crashed or hung is dropped and started again on the next call. A call
never raises for what the server did: it returns a `CallOutcome` whose text says what happened, for the
agent to read; the text is the server's, untrusted, cut to `max_chars` with a note.

HTTP servers: redirects are not followed at all (the client below is built with `follow_redirects=False`,
and the SDK itself follows none off the endpoint's origin), so a server cannot send the bot's headers to
`169.254.169.254` or anywhere else. Stdio servers run with the bot's privileges (docs/mcp.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TextIO

from core.logging import get_logger
from core.mcp_config import McpServer, Transport
from core.mcp_tool_list import MAX_TOOLS_LISTED, OfferedTool, offered_tools

if TYPE_CHECKING:
    from mcp import ClientSession

log = get_logger(__name__)

CONNECT_TIMEOUT_SECONDS = 30.0  # a server's start and handshake, and its tool list
MAX_RESULT_CHARS = 20_000  # what one call returns to a model; the rest is cut with a note
MAX_ERROR_CHARS = 300
MAX_LIST_PAGES = 20


class CallStatus(StrEnum):
    """The `outcome` of a call in logs, metrics and a run's records."""

    OK = "ok"
    TOOL_ERROR = "tool_error"  # the server answered that the tool failed
    TIMEOUT = "timeout"
    FAILED = "failed"  # the server could not be reached, crashed, or answered nonsense
    REFUSED = "refused"  # crewbot refused the call (not allowed, over a run's limits, the run ended)


@dataclass(frozen=True, slots=True)
class CallOutcome:
    status: CallStatus
    text: str  # what the agent reads
    result_chars: int  # of the server's answer, before any cut
    seconds: float


class ServerUnavailable(Exception):
    """The server did not start, answer its handshake or list its tools; the message says why, redacted."""


class McpConnection:
    """Open on first use; `close()` ends the session and, for stdio, the server's process."""

    def __init__(self, server: McpServer, errlog: TextIO | None = None) -> None:
        self.server = server
        self._errlog = errlog
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._opening = asyncio.Lock()
        self._tools: tuple[OfferedTool, ...] | None = None

    async def tools(self) -> tuple[OfferedTool, ...]:
        """The tools offered of this server (listed once per connection); ServerUnavailable when it cannot."""
        session = await self._open()
        if self._tools is None:
            try:
                async with asyncio.timeout(self.server.timeout_seconds):
                    listed = await _list_all(session)
            except Exception as exc:
                await self._drop()
                raise ServerUnavailable(self._reason("listing its tools failed", exc)) from None
            self._tools = offered_tools(self.server, listed)
        return self._tools

    async def call(self, tool: str, arguments: dict[str, Any], max_chars: int = MAX_RESULT_CHARS) -> CallOutcome:
        started = time.monotonic()
        timeout = self.server.timeout_seconds

        def outcome(status: CallStatus, text: str, chars: int = 0) -> CallOutcome:
            return CallOutcome(status, text, chars, time.monotonic() - started)

        try:
            session = await self._open()  # a start is bounded by CONNECT_TIMEOUT_SECONDS, not the call's
            async with asyncio.timeout(timeout):
                result = await session.call_tool(tool, arguments)
        except ServerUnavailable as exc:
            return outcome(CallStatus.FAILED, f"The tool could not be called: {exc}")
        except TimeoutError:
            await self._drop()  # a hung server may hold its stdio pipe: start it again next time
            return outcome(CallStatus.TIMEOUT, f"The tool did not answer within {timeout:g} s.")
        except Exception as exc:
            await self._drop()
            return outcome(CallStatus.FAILED, f"The tool call failed: {self._reason('', exc)}")
        text = render_result(result)
        status = CallStatus.TOOL_ERROR if getattr(result, "is_error", False) else CallStatus.OK
        shown = cut(text, max_chars)
        if status is CallStatus.TOOL_ERROR:
            shown = f"The tool reported an error: {shown}"
        return outcome(status, shown, len(text))

    async def close(self) -> None:
        await self._drop()

    async def _open(self) -> ClientSession:
        async with self._opening:
            if self._session is not None and self._holder is not None and not self._holder.done():
                return self._session
            await self._drop()
            self._stop = asyncio.Event()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._holder = asyncio.create_task(self._hold(ready), name=f"mcp-{self.server.name}")
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    self._session = await asyncio.shield(ready)
            except Exception as exc:
                await self._drop()
                raise ServerUnavailable(self._reason("it did not start", exc)) from None
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                if not ready.done():
                    ready.set_result(session)
                await self._stop.wait()
        except BaseException as exc:  # the transport's task group raises groups and cancellations alike
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("the session ended"))
            if not isinstance(exc, Exception):
                raise
            log.info("mcp_session_ended", server=self.server.name, error=self._reason("", exc))
        finally:
            self._session = None
            self._tools = None

    def _transport(self, stack: contextlib.AsyncExitStack) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if server.transport is Transport.STDIO:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=server.command,
                args=list(server.args),
                env=dict(server.env or {}),
                cwd=server.cwd,
                encoding_error_handler="replace",
            )
            return stdio_client(params, errlog=self._errlog) if self._errlog else stdio_client(params)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(
            headers=dict(server.headers or {}),
            follow_redirects=False,
            timeout=httpx2.Timeout(server.timeout_seconds, connect=min(server.timeout_seconds, 10.0)),
            trust_env=False,  # no proxy from the environment sees the headers
        )
        stack.push_async_callback(client.aclose)
        return streamable_http_client(server.url, http_client=client)

    async def _drop(self) -> None:
        holder, self._holder, self._session, self._tools = self._holder, None, None, None
        if holder is None or holder.done():
            return
        self._stop.set()
        try:
            async with asyncio.timeout(5.0):
                await asyncio.shield(holder)
        except (TimeoutError, Exception):
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder

    def _reason(self, what: str, exc: BaseException) -> str:
        return redact(self.server, f"{what}: {describe(exc)}" if what else describe(exc))


async def _list_all(session: ClientSession) -> list[Any]:
    """Every page of the tool list, up to MAX_TOOLS_LISTED tools and MAX_LIST_PAGES pages."""
    from mcp import types

    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools[: MAX_TOOLS_LISTED - len(tools)])
        cursor = page.next_cursor
        if cursor is None or len(tools) >= MAX_TOOLS_LISTED:
            break
    if len(tools) >= MAX_TOOLS_LISTED or cursor is not None:
        log.warning("mcp_tool_list_cut", listed=len(tools), most=MAX_TOOLS_LISTED)
    return tools


def render_result(result: Any) -> str:
    """The text of a CallToolResult: its text parts, other parts named, structured content as JSON."""
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(str(getattr(item, "text", "")))
        elif kind == "resource" and hasattr(getattr(item, "resource", None), "text"):
            parts.append(str(item.resource.text))
        else:
            parts.append(f"[{kind or 'unknown'} content omitted]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        with contextlib.suppress(TypeError, ValueError):
            parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts) or "(no output)"


def cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n[cut: the result had {len(text)} characters; the first {max_chars} are shown]"


def describe(exc: BaseException) -> str:
    """One line of what went wrong; an exception group names its first cause."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    words = " ".join(str(exc).split()) or type(exc).__name__
    return words[:MAX_ERROR_CHARS]


def redact(server: McpServer, text: str) -> str:
    for secret in server.secret_values:
        text = text.replace(secret, "<redacted>")
    return text
