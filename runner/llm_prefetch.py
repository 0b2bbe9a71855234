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

from core.logging import get_logger

PREFETCH_HEADER = "X-Crewbot-Prefetch"
PREFETCH_TOKEN_BYTES = 16
# Containers whose first request differs from the host's copy, one after another, before the host stops
# sending early calls: their image runs other agent code than the host's checkout, and each call is wasted.
MISSES_BEFORE_OFF = 3
REBUILD_HINT = "is the subagent image older than this checkout? rebuild it: python -m runner.image"

log = get_logger(__name__)


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

    def take(self, path: str, key: str, followups: int, mark: PrefetchMark, run_id: str) -> bool:
        """Whether the container's request gets the kept answer: only its first may, and only if it is the
        same request and the chat has said nothing more since (else the answer would not have heard it)."""
        if self.used:
            return False
        self.used = True
        if followups != self.followups:
            return False
        same = (path, key) == (self.path, self.key)
        mark.outcome(run_id, handed_over=same)
        return same

    def keep(self, response: web.StreamResponse | None) -> None:
        """Keep a whole 200 answer; anything else (a stream, an error) leaves the container to ask itself."""
        if self.answer.done():
            return
        kept = None
        if isinstance(response, web.Response) and response.status == 200 and isinstance(response.body, bytes):
            kept = KeptAnswer(response.status, response.body, response.content_type)
        self.answer.set_result(kept)


class PrefetchMark:
    """The header value that marks the host's own first calls (containers never see it), and whether the
    containers' first requests still match the host's copies."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_hex(PREFETCH_TOKEN_BYTES)
        self.misses_in_a_row = 0

    def marks(self, headers: Mapping[str, str]) -> bool:
        value = headers.get(PREFETCH_HEADER)
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())

    @property
    def trusted(self) -> bool:
        """False once MISSES_BEFORE_OFF containers in a row asked otherwise: no early calls until a restart."""
        return self.misses_in_a_row < MISSES_BEFORE_OFF

    def outcome(self, run_id: str, *, handed_over: bool) -> None:
        """How a container's first request compared with the host's copy."""
        if handed_over:
            self.misses_in_a_row = 0
            return
        self.misses_in_a_row += 1
        log.warning("first_call_mismatch", run_id=run_id, misses_in_a_row=self.misses_in_a_row, hint=REBUILD_HINT)
        if self.misses_in_a_row == MISSES_BEFORE_OFF:
            log.error("early_first_calls_off", misses=MISSES_BEFORE_OFF, hint=REBUILD_HINT)


def body_key(payload: dict[str, Any]) -> str:
    """The body as canonical JSON: the same request compares equal whatever its key order or spacing."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
