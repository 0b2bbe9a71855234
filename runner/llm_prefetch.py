"""A run's first LLM call, made before its container asks for it, and handed over when it does.

The host sends a run's first call itself as soon as the container has started (runner/first_call.py),
so the model works while the container's Python starts. That call comes in on the run's own socket like
any other, marked with a header only the host knows, and goes through the proxy's gate, budget and
policy as usual; its answer is kept here. When the container's own first request arrives with the same
path and the same JSON body, it gets that answer instead of a second call. Anything else (another body,
a follow-up from the chat in between, a failed first call) goes to the provider as usual.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PREFETCH_HEADER = "X-Crewbot-Prefetch"
PREFETCH_TOKEN_BYTES = 16


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    """A complete, successful answer, as the container would have had it."""

    status: int
    body: bytes
    content_type: str

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body, headers={"Content-Type": self.content_type})


def _new_future() -> asyncio.Future[KeptAnswer | None]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False, slots=True)
class PrefetchedCall:
    """The first call of a run: what it asked, and its answer once it has one (None: none to hand over)."""

    path: str
    key: str
    followups: int
    answer: asyncio.Future[KeptAnswer | None] = field(default_factory=_new_future)
    used: bool = False

    def matches(self, path: str, key: str | None, followups: int) -> bool:
        return not self.used and key is not None and (path, key, followups) == (self.path, self.key, self.followups)

    def keep(self, response: web.StreamResponse | None) -> None:
        """Keep a whole 200 answer; anything else (a stream, an error) leaves the container to ask itself."""
        if self.answer.done():
            return
        kept = None
        if isinstance(response, web.Response) and response.status == 200 and isinstance(response.body, bytes):
            kept = KeptAnswer(response.status, response.body, response.content_type)
        self.answer.set_result(kept)


class PrefetchMark:
    """The header value that marks the host's own first calls; containers never see it."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_hex(PREFETCH_TOKEN_BYTES)

    def marks(self, headers: Mapping[str, str]) -> bool:
        value = headers.get(PREFETCH_HEADER)
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())


def body_key(payload: dict[str, Any]) -> str:
    """The body as canonical JSON: the same request compares equal whatever its key order or spacing."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
