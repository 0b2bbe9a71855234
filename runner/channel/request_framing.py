"""How a request on a run's socket must be framed before any of its body is read.

The clients on a run's socket are ours (container/channel.py, and the SDK the host itself calls there for a
model step): each sends its body with a Content-Length and none compresses. A `Content-Encoding` would have
aiohttp inflate the body on the event loop before any limit sees it (8 KB of deflate became 8 MB of line
feeds and a 6 s stall), and a chunked body costs the loop per chunk (500 KB sent as 1-byte chunks held it for
0.3 s): both are refused unread, and count against the run as invalid.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import hdrs, web

NO_ENCODING_STATUS = 415  # RFC 9110: a content coding the server does not take
LENGTH_REQUIRED_STATUS = 411


@dataclass(frozen=True, slots=True)
class FramingRefused:
    status: int
    reason: str


def framing_refusal(request: web.Request) -> FramingRefused | None:
    """Why the request's framing is refused (before any of its body is read), or None when it is one ours send."""
    if hdrs.CONTENT_ENCODING in request.headers:
        return FramingRefused(
            NO_ENCODING_STATUS, "a run's channel takes no Content-Encoding: send the body as it is, uncompressed"
        )
    if request.body_exists and request.content_length is None:
        return FramingRefused(
            LENGTH_REQUIRED_STATUS, "a run's channel takes a body only with a Content-Length (not chunked)"
        )
    return None
