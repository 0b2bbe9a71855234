"""A run's first LLM call, made before its container asks for it, and handed over when it does.

The host sends a run's first call itself as soon as the container has started (runner/first_call.py),
so the model works while the container's Python starts. That call comes in on the run's own socket like
any other, marked with a header only the host knows, and goes through the proxy's gate, budget and
policy as usual; its answer is kept here. When the container's first request arrives with the same path
and the same JSON body, it gets that answer instead of a second call, and holds no budget for it.
Anything else (another body, a follow-up from the chat in between, a failed first call) goes to the
provider as usual. Which request plays which part is decided as it arrives, before its body is read, so
no ordering of the two can make the same first call be paid twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aiohttp import web

from core.logging import get_logger
from runner.llm_upstream import ProxyError

PREFETCH_HEADER = "X-Crewbot-Prefetch"
PREFETCH_TOKEN_BYTES = 16
# Containers whose first request differs from the host's copy, one after another, before the host stops
# sending early calls: their image runs other agent code than the host's checkout, and each call is wasted.
MISSES_BEFORE_OFF = 3
# Then it tries one again after this long: a rebuilt image, or containers that only pretended, turn it back on.
OFF_SECONDS = 900.0
REBUILD_HINT = "is the subagent image older than this checkout? rebuild it: python -m runner.image"

log = get_logger(__name__)


class Role(Enum):
    """What a request on a run's socket is, as far as the first call goes."""

    HOST = "host"  # the host's early first call
    CANDIDATE = "candidate"  # the container's first request after it: may get its answer
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    """A complete, successful answer, as the container would have had it."""

    status: int
    body: bytes
    content_type: str

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body, headers={"Content-Type": self.content_type})


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False, slots=True)
class EarlyCall:
    """The host's first call of a run: what it asked (path, body key, follow-ups) once parsed, and its answer
    once it has one. Either is None when there is none to compare with or hand over."""

    path: str
    asked: asyncio.Future[tuple[str, int] | None] = field(default_factory=_future)
    answer: asyncio.Future[KeptAnswer | None] = field(default_factory=_future)

    def settle(self, response: web.StreamResponse | None) -> None:
        """The host's call is over: keep a whole 200 answer; anything else (a stream, an error, a refusal
        before it was parsed) leaves the container to ask itself."""
        if not self.asked.done():
            self.asked.set_result(None)
        if self.answer.done():
            return
        kept = None
        if isinstance(response, web.Response) and response.status == 200 and isinstance(response.body, bytes):
            kept = KeptAnswer(response.status, response.body, response.content_type)
        self.answer.set_result(kept)


@dataclass(slots=True)
class FirstCallSlot:
    """One run's first-call bookkeeping: requests begun, the host's early call, and how it ended."""

    begun: int = 0
    early: EarlyCall | None = None
    candidate_taken: bool = False
    handed_over: bool | None = None  # None: no early call; then whether the container got its answer

    def enter(self, path: str, marked: bool) -> Role:
        """The part of a request that has just arrived (its body not read yet). Raises 409 for a host call
        that comes after the run's first request: it would be wasted."""
        self.begun += 1
        if marked:
            if self.begun > 1:
                raise ProxyError(409, "first_call_too_late", "the run has made its first call")
            self.early = EarlyCall(path)
            self.handed_over = False
            return Role.HOST
        if self.early is not None and not self.candidate_taken:
            self.candidate_taken = True  # only the container's first request may get the early answer
            return Role.CANDIDATE
        return Role.OTHER

    def handed(self) -> None:
        self.handed_over = True
        self.early = None  # the answer is delivered: nothing of it need stay in memory


class PrefetchMark:
    """The header value that marks the host's own first calls (containers never see it), and whether the
    containers' first requests still match the host's copies."""

    def __init__(self, token: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.token = token or secrets.token_hex(PREFETCH_TOKEN_BYTES)
        self.misses_in_a_row = 0
        self._clock = clock
        self._off_until: float | None = None

    def marks(self, headers: Mapping[str, str]) -> bool:
        value = headers.get(PREFETCH_HEADER)
        # A container sends whatever bytes it likes: only ASCII can be the token (and encode without error).
        return value is not None and value.isascii() and hmac.compare_digest(value.encode(), self.token.encode())

    def allows_early_call(self) -> bool:
        """False for OFF_SECONDS once MISSES_BEFORE_OFF containers in a row asked otherwise; then one more
        early call is tried, and one more miss turns them off again."""
        if self._off_until is None:
            return True
        if self._clock() < self._off_until:
            return False
        self._off_until = None
        self.misses_in_a_row = MISSES_BEFORE_OFF - 1
        return True

    def outcome(self, run_id: str, *, same: bool) -> None:
        """How a container's first request compared with the host's copy."""
        if same:
            self.misses_in_a_row = 0
            return
        self.misses_in_a_row += 1
        log.warning("first_call_mismatch", run_id=run_id, misses_in_a_row=self.misses_in_a_row, hint=REBUILD_HINT)
        if self.misses_in_a_row >= MISSES_BEFORE_OFF:
            self._off_until = self._clock() + OFF_SECONDS
            log.error("early_first_calls_off", misses=self.misses_in_a_row, seconds=OFF_SECONDS, hint=REBUILD_HINT)


def body_key(path: str, payload: dict[str, Any]) -> str:
    """A digest of the path and the body as canonical JSON: the same request gives the same key whatever its
    key order or spacing, and a kept key costs 64 bytes whatever the body's size."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{path}\n{canonical}".encode()).hexdigest()
