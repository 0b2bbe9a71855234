"""The HTTP client of a streamable-HTTP MCP server: a body that is not an event stream (a JSON answer) is cut off
past MAX_MESSAGE_BYTES, counted as it arrives, never read whole first. Event streams are bounded per event by
the SDK's own `max_sse_event_size`, which core/mcp_client.py sets to the same limit.

The client follows no redirect, and takes no proxy from the environment (no proxy sees the headers).
Imported on a server's first connection, with httpx2.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx2

from core.mcp_stdio import MAX_MESSAGE_BYTES, Link, too_large

CONNECT_TIMEOUT_SECONDS = 10.0


class ResponseTooLarge(httpx2.StreamError):
    """A StreamError: the SDK answers the waiting call with it (a failed call, not a hung one)."""


def capped_client(
    headers: Mapping[str, str], timeout_seconds: float, link: Link, max_bytes: int = MAX_MESSAGE_BYTES
) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        # Identity only: the cap counts the bytes as they arrive, and a compressed body would be inflated past it
        # after the count (4 MiB of gzip is 4 GiB of JSON); a server that compresses anyway is refused.
        headers={**headers, "Accept-Encoding": "identity"},
        follow_redirects=False,
        timeout=httpx2.Timeout(timeout_seconds, connect=min(timeout_seconds, CONNECT_TIMEOUT_SECONDS)),
        trust_env=False,
        transport=CappedTransport(link, max_bytes),
    )


class CappedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, link: Link, max_bytes: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self._link = link
        self._max_bytes = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return response
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        if response.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
            await response.aclose()
            self._link.problem = "it compressed its answer although asked not to (Accept-Encoding: identity)"
            raise ResponseTooLarge(self._link.problem)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self._max_bytes, self._link),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int, link: Link) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._link = link

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in self._inner:
            received += len(chunk)
            if received > self._max_bytes:
                self._link.problem = too_large(self._max_bytes)
                raise ResponseTooLarge(self._link.problem)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
