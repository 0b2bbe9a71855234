"""One connection to one MCP server, held open between calls, and a tool call through it, bounded.

The session lives in a task of its own (the SDK's transports must be entered and left in one task); callers
use it from any task, many calls at once. A call that times out is cancelled alone (the SDK tells the server);
the connection is dropped, and started again on the next call, only when its transport is dead (the process
exited, stdout closed, a message over MAX_MESSAGE_BYTES), so one chat's slow call never fails another's. A call
never raises for what the server did: it returns a `CallOutcome` whose text says what happened, for the
agent to read; the text is the server's, untrusted, redacted of the server's secrets, then cut to `max_chars`.

Every message a server sends is bounded (core/mcp_stdio.py, core/mcp_http.py). HTTP servers: redirects are not
followed at all, so a server cannot send the bot's headers to `169.254.169.254` or anywhere else. Stdio servers
run with the bot's privileges (docs/mcp.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from core.logging import get_logger
from core.mcp_config import McpServer, Transport
from core.mcp_stdio import MAX_MESSAGE_BYTES, PARSE_IN_THREAD_BYTES, Link, StdioCommand, stdio_transport
from core.mcp_tool_list import MAX_TOOLS_LISTED, OfferedTool, SchemaChecks, offered_tools

if TYPE_CHECKING:
    from core.mcp_sdk import ClientSession

log = get_logger(__name__)

CONNECT_TIMEOUT_SECONDS = 30.0  # a server's start and handshake, and its tool list
MAX_RESULT_CHARS = 20_000  # what one call returns to a model; the rest is cut with a note
MAX_ERROR_CHARS = 300
MAX_ERROR_READ_CHARS = 4 * MAX_ERROR_CHARS  # of an exception's text read before redaction: a secret across this
# cut is never shown (it lies past MAX_ERROR_CHARS), and a megabyte of error text costs nothing
MAX_LIST_PAGES = 20
MIN_FRAGMENT_CHARS = 8  # of a secret, redacted from a server's stderr even when the rest of it is on another line


class CallStatus(StrEnum):
    """The `outcome` of a call in logs, metrics and a run's records."""

    OK = "ok"
    TOOL_ERROR = "tool_error"  # the server answered that the tool failed
    TIMEOUT = "timeout"
    FAILED = "failed"  # the server could not be reached, crashed, or answered nonsense
    REFUSED = "refused"  # crewbot refused the call (not allowed, over a run's limits, the run ended)
    CANCELLED = "cancelled"  # the caller went away (a turn aborted, a run stopped) before the answer


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

    def __init__(self, server: McpServer, checks: SchemaChecks | None = None) -> None:
        self.server = server
        self._checks = checks if checks is not None else SchemaChecks()
        self._link = Link()
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
                problem = self._link.problem
                await self._drop()
                raise ServerUnavailable(problem or self._reason("listing its tools failed", exc)) from None
            self._tools = await offered_tools(self.server, listed, self._checks)
        return self._tools

    @property
    def listed(self) -> bool:
        """The tools of the open connection are known: `tools()` answers without waiting."""
        return self._tools is not None and self._alive()

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        max_chars: int = MAX_RESULT_CHARS,
        still_wanted: Callable[[], bool] | None = None,
    ) -> CallOutcome:
        """`still_wanted` is asked once the server is open, right before the call is sent: a run that ended while
        the server started makes no call (a tool with side effects is not run for a run that is gone)."""
        started = time.monotonic()
        timeout = self.server.timeout_seconds

        def outcome(status: CallStatus, text: str, chars: int = 0) -> CallOutcome:
            return CallOutcome(status, text, chars, time.monotonic() - started)

        try:
            session = await self._open()  # a start is bounded by CONNECT_TIMEOUT_SECONDS, not the call's
            if still_wanted is not None and not still_wanted():
                return outcome(CallStatus.REFUSED, "The call was not made: the run it was for has ended.")
            async with asyncio.timeout(timeout):
                result = await session.call_tool(tool, arguments)
        except ServerUnavailable as exc:
            return outcome(CallStatus.FAILED, f"The tool could not be called: {exc}")
        except TimeoutError:
            # Only this call is abandoned (the SDK sends the server a cancel): other chats' calls on the same
            # connection go on. A hung process is not dropped here: its next failure that kills the transport is.
            return outcome(CallStatus.TIMEOUT, f"The tool did not answer within {timeout:g} s.")
        except Exception as exc:
            reason = self._link.problem or self._reason("", exc)
            if self._transport_dead(exc):
                await self._drop()
            return outcome(CallStatus.FAILED, f"The tool call failed: {reason}")
        text = render_result(result)
        status = CallStatus.TOOL_ERROR if getattr(result, "is_error", False) else CallStatus.OK
        # Redacted before the cut (a secret across the cut would leave its start), off the loop when long.
        if len(text) > PARSE_IN_THREAD_BYTES:
            text = await asyncio.to_thread(redact, self.server, text)
        else:
            text = redact(self.server, text)
        shown = cut(text, max_chars)
        if status is CallStatus.TOOL_ERROR:
            shown = f"The tool reported an error: {shown}"
        return outcome(status, shown, len(text))

    async def close(self) -> None:
        await self._drop()

    async def _open(self) -> ClientSession:
        async with self._opening:
            if self._session is not None and self._alive():
                return self._session
            await self._drop()
            self._stop = asyncio.Event()
            self._link = Link()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            ready.add_done_callback(_retrieved)  # a start that failed after its wait timed out is not an error twice
            self._holder = asyncio.create_task(self._hold(ready), name=f"mcp-{self.server.name}")
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    self._session = await asyncio.shield(ready)
            except Exception as exc:
                problem = self._link.problem
                await self._drop()
                raise ServerUnavailable(problem or self._reason("it did not start", exc)) from None
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        from core.mcp_sdk import ClientSession

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
            command = StdioCommand(server.command, server.args, dict(server.env or {}), server.cwd, server.name)
            return stdio_transport(command, self._link, lambda text: redact_fragments(server, text))
        from core.mcp_http import capped_client
        from core.mcp_sdk import streamable_http_client

        client = capped_client(server.headers or {}, server.timeout_seconds, self._link)
        stack.push_async_callback(client.aclose)
        return streamable_http_client(server.url, http_client=client, max_sse_event_size=MAX_MESSAGE_BYTES)

    def _alive(self) -> bool:
        return self._holder is not None and not self._holder.done() and not self._link.closed

    def _transport_dead(self, exc: Exception) -> bool:
        """Whether a failed call says the connection is gone (not just that this call failed: a JSON-RPC error
        such as invalid arguments, which any caller can provoke, leaves the connection to the others)."""
        from core.mcp_sdk import CONNECTION_CLOSED, MCPError

        if not self._alive():
            return True
        if isinstance(exc, MCPError):
            return exc.error.code == CONNECTION_CLOSED or "session terminated" in exc.error.message.lower()
        return True

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
        """Redacted before it is cut: a secret across the cut would leave its start in the text."""
        said = describe(exc, MAX_ERROR_READ_CHARS)
        return redact(self.server, f"{what}: {said}" if what else said)[:MAX_ERROR_CHARS]


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _list_all(session: ClientSession) -> list[Any]:
    """Every page of the tool list, up to MAX_TOOLS_LISTED tools and MAX_LIST_PAGES pages."""
    from core.mcp_sdk import PaginatedRequestParams

    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
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


def describe(exc: BaseException, max_chars: int = MAX_ERROR_CHARS) -> str:
    """One line of what went wrong; an exception group names its first cause. Not redacted: see `_reason`."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    words = " ".join(str(exc)[: max_chars * 2].split()) or type(exc).__name__
    return words[:max_chars]


def redact(server: McpServer, text: str) -> str:
    for secret in server.secret_values:
        text = text.replace(secret, "<redacted>")
    return text


def redact_fragments(server: McpServer, text: str, min_chars: int = MIN_FRAGMENT_CHARS) -> str:
    """`redact`, and any `min_chars` or more characters in a row of a secret too: for a server's stderr, whose
    tracebacks wrap at 80 columns and cut a secret in two. For short texts (a log line): the cost is per character."""
    text = redact(server, text)
    secrets = [secret for secret in server.secret_values if len(secret) >= min_chars]
    if not secrets:
        return text
    kept: list[str] = []
    index = 0
    while index < len(text):
        end = index
        for secret in secrets:
            if text[index : index + min_chars] in secret:
                stop = index + min_chars
                while stop < len(text) and text[index : stop + 1] in secret:
                    stop += 1
                end = max(end, stop)
        if end > index:
            kept.append("<redacted>")
            index = end
        else:
            kept.append(text[index])
            index += 1
    return "".join(kept)
