"""How a request on a run's socket must be framed before any of its body is read, and what a head aiohttp's
parser refuses counts for.

The clients on a run's socket are ours (container/channel.py, and the SDK the host itself calls there for a
model step): each sends its body with a Content-Length and none compresses. A `Content-Encoding` would have
aiohttp inflate the body on the event loop before any limit sees it (8 KB of deflate became 8 MB of line
feeds and a 6 s stall), and a chunked body costs the loop per chunk (500 KB sent as 1-byte chunks held it for
0.3 s): both are refused unread, and count against the run as invalid.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from container.protocol import RUN_API_PREFIX
from runner.channel.channel_answers import answer
from runner.channel.llm_policy import INVALID_REQUEST
from runner.channel.proxy_error import ProxyError

MAX_SHOWN_CHARS = 100  # of aiohttp's reason for refusing a head: it may quote the head
NO_ENCODING_STATUS = 415  # RFC 9110: a content coding the server does not take
LENGTH_REQUIRED_STATUS = 411


@dataclass(frozen=True, slots=True)
class FramingRefused:
    status: int
    reason: str


def refusal_response(request: web.Request, status: int, reason: str) -> web.Response:
    """A refusal in the shape its path's client reads: the run API's answer, or the provider's error for the SDK."""
    if request.path.startswith(RUN_API_PREFIX):
        return answer(status, False, reason)
    return ProxyError(status, INVALID_REQUEST, reason).response()


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


class RunServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic only in typeshed
    """aiohttp's server log for one run's socket. A request head its parser refuses (a doubled Content-Length,
    Content-Length beside chunks, a folded header) is answered 400 before any handler runs, and aiohttp logs
    each with a traceback: 1,000 of them were 1,000 tracebacks and counted for nothing. Here such a head counts
    against the run (`on_malformed`, which logs it in a line); anything else goes to aiohttp's log as before."""

    def __init__(self, on_malformed: Callable[[str], None]) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self._on_malformed = on_malformed

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            reason = " ".join(str(exc_info.message).split())[:MAX_SHOWN_CHARS]
            self._on_malformed(f"a request head the HTTP parser refuses: {reason}")
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)
