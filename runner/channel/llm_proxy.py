"""The LLM proxy: each run gets its own Unix socket, and the host, not the container, talks to the provider.

A run is identified by the socket its request arrived on (no token to steal or forge). The proxy adds the
provider key, counts tokens and requests per run, and refuses (403) a run the manager no longer considers
live, checking before it forwards, while the upstream call is in flight, and when the answer comes back.
Every body is rebuilt by the request policy (runner/channel/llm_policy.py) with its output capped by what is left of
the run's token budget once the calls already in flight have had theirs: parallel calls cannot each spend
the whole remainder (runner/channel/llm_budget.py). A run out of budget gets 429, and `on_budget_exhausted` hears
of it once. Each call also holds its share of its chat's daily allowance (runner/channel/llm_allowance.py).
Talking to the provider is runner/channel/llm_upstream.py, token counting runner/channel/llm_usage.py.

Streaming is passed through: for `stream: true` the upstream's server-sent events are relayed as they
arrive and the usage is read from the events as they pass (OpenAI chat completions get
`stream_options.include_usage` so the last event carries it). Once a stream has started a closed run can
no longer get a 403, so the proxy ends the stream with an error event instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from aiohttp import web

from container.protocol import MAX_STEP_BYTES, RUN_API_PREFIX
from core.logging import get_logger
from runner.channel import llm_request
from runner.channel.capped_site import CappedUnixSite
from runner.channel.llm_allowance import AllowanceRefused, Payer, ProxyAllowance
from runner.channel.llm_budget import BudgetCallback, BudgetNotices, BudgetSpent, input_hold
from runner.channel.llm_call_log import CallLog
from runner.channel.llm_policy import INVALID_REQUEST, RequestPolicy
from runner.channel.llm_request import Forwarded
from runner.channel.llm_upstream import Call, Upstream, UpstreamConfig
from runner.channel.llm_usage import Usage
from runner.channel.offline_subagent import OfflineSubagentModel
from runner.channel.proxy_error import ProxyError
from runner.channel.request_framing import RunServerLog, framing_refusal, refusal_response
from runner.channel.run_api import RunEndpoint, answer, handle_run_api

# UpstreamConfig is re-exported: callers build the proxy from this module (runner/service.py).
__all__ = ["LlmProxy", "RunGate", "Spent", "UpstreamConfig", "UsageSink"]

MAX_BODY_BYTES = 8 * 1024 * 1024
# Per run: a model step, the host's own LLM request for it (on the same socket) and one more body at once.
MAX_BYTES_IN_FLIGHT = 3 * MAX_BODY_BYTES
DEFAULT_MAX_REQUESTS_PER_RUN = 500
GATE_POLL_SECONDS = 0.25
# Handlers get this long to finish their answer (usually a 403) when a run's socket closes.
CLOSE_GRACE_SECONDS = 2.0
SOCKET_MODE = 0o666  # the container's uid must connect; the run dir's permissions guard who can reach it
MAX_UNIX_PATH_BYTES = 107  # sun_path holds 108 bytes including the terminating NUL
# A body left unread (refused as too large, or on a path that takes none) is not drained: aiohttp would read
# and discard it for up to 10 s by default, so a container could make the host read without limit.
LINGERING_SECONDS = 0.0


class RunGate(Protocol):
    def is_live(self, run_id: str) -> bool:
        """True while the run may call the LLM (queued or running, not cancelled). Must not block."""
        ...

    def followups(self, run_id: str) -> list[str]:
        """What the chat sent the run so far (the main agent's `send`), added to each of its requests."""


class UsageSink(Protocol):
    async def record_usage(self, run_id: str, input_tokens: int, output_tokens: int, requests: int) -> None:
        """Add one call's usage to the run's totals (the values are increments, not totals)."""
        ...


@dataclass(frozen=True, slots=True)
class Spent:
    """What a run used before this socket opened (a re-attached run keeps its budget spent)."""

    tokens: int = 0
    requests: int = 0


class _RunClosed(Exception):
    pass


def _closed_error(run_id: str) -> ProxyError:
    return ProxyError(403, "run_closed", f"run {run_id} is cancelled or finished")


@dataclass(eq=False, slots=True)
class _Run:
    run_id: str
    socket_path: Path
    endpoint: RunEndpoint | None = None
    runner: web.AppRunner | None = None
    requests: int = 0
    bytes_in_flight: int = 0  # request bodies being read or held by their handlers, at their declared size
    tokens: int = 0
    reserved: int = 0  # tokens the calls in flight may still spend: their estimated input and output cap
    budget_told: bool = False
    closed: bool = False
    payer: Payer | None = None  # whose daily allowance its calls spend (runner/channel/llm_allowance.py)
    calls: set[asyncio.Task[web.StreamResponse]] = field(default_factory=set)


_RUN_KEY = web.AppKey("crewbot_run", _Run)


class LlmProxy:
    """Serves the LLM to each run on its own Unix socket; see the module docstring for the rules."""

    def __init__(
        self,
        upstream: UpstreamConfig,
        run_gate: RunGate,
        usage_sink: UsageSink,
        *,
        policy: RequestPolicy,
        max_tokens_per_run: int,
        on_budget_exhausted: BudgetCallback | None = None,
        max_requests_per_run: int = DEFAULT_MAX_REQUESTS_PER_RUN,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_bytes_in_flight: int = MAX_BYTES_IN_FLIGHT,
        gate_poll_seconds: float = GATE_POLL_SECONDS,
        offline_model: OfflineSubagentModel | None = None,
        allowance: ProxyAllowance | None = None,
    ) -> None:
        self._upstream = Upstream(upstream, policy, offline_model)
        self._policy = policy
        self._max_tokens = max_tokens_per_run
        self._budget_notices = BudgetNotices(on_budget_exhausted)
        self._gate = run_gate
        self._sink = usage_sink
        self._max_requests = max_requests_per_run
        self._max_body_bytes = max_body_bytes
        self._max_bytes_in_flight = max_bytes_in_flight
        self._gate_poll_seconds = gate_poll_seconds
        self._runs: dict[str, _Run] = {}
        self._log = get_logger(__name__)
        self._calls = CallLog(upstream.provider.value)
        self._allowance = allowance or ProxyAllowance()

    # -- lifecycle --------------------------------------------------------------------------------

    async def open_run(
        self,
        run_id: str,
        socket_path: Path,
        *,
        endpoint: RunEndpoint | None = None,
        spent: Spent | None = None,
        payer: Payer | None = None,
        listening: socket.socket | None = None,
    ) -> None:
        """Listen on `socket_path` for this run: its LLM calls, spent by `payer`, and its run API served by
        `endpoint`. The socket's folder must be the host's alone (the container mounts it read-only).
        `listening`: the socket already bound there (a claimed warm pool member's), served as it is."""
        if run_id in self._runs:
            raise ValueError(f"run {run_id} already has an LLM socket")
        if len(os.fsencode(socket_path)) > MAX_UNIX_PATH_BYTES:
            raise ValueError(
                f"LLM socket path is {len(os.fsencode(socket_path))} bytes, over the {MAX_UNIX_PATH_BYTES}-byte "
                f"limit of Unix sockets: {socket_path} (use a shorter DATA_DIR)"
            )
        spent = spent or Spent()
        run = _Run(run_id, socket_path, endpoint, requests=spent.requests, tokens=spent.tokens, payer=payer)
        app = web.Application(client_max_size=self._max_body_bytes)
        app[_RUN_KEY] = run
        app.router.add_route("*", "/{path:.*}", self._handle)
        # auto_decompress off: a compressed body is never inflated on the loop (it is refused unread anyway).
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=CLOSE_GRACE_SECONDS,
            lingering_time=LINGERING_SECONDS,
            auto_decompress=False,
            logger=RunServerLog(functools.partial(self._invalid, run, 400)),
        )
        await runner.setup()
        try:
            await CappedUnixSite(runner, str(socket_path), listening=listening).start()
            os.chmod(socket_path, SOCKET_MODE)
        except BaseException:
            await runner.cleanup()
            raise
        run.runner = runner
        self._runs[run_id] = run
        self._log.info("llm_socket_open", run_id=run_id, socket=str(socket_path))

    async def close_run(self, run_id: str) -> None:
        """Stop serving the run: in-flight upstream calls are dropped and answered 403. Unknown run: no-op."""
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        run.closed = True
        self._allowance.forget(run_id)
        for task in list(run.calls):
            task.cancel()
        if run.runner is not None:
            await run.runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            run.socket_path.unlink()
        self._log.info("llm_socket_closed", run_id=run_id, requests=run.requests)

    async def close(self) -> None:
        for run_id in list(self._runs):
            await self.close_run(run_id)
        await self._budget_notices.close()
        await self._upstream.close()

    def open_runs(self) -> list[str]:
        return list(self._runs)

    # -- one request ------------------------------------------------------------------------------

    def _live(self, run: _Run) -> bool:
        return not run.closed and self._gate.is_live(run.run_id)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        run = request.app[_RUN_KEY]
        refused = framing_refusal(request)
        if refused is not None:
            self._invalid(run, refused.status, refused.reason)
            return refusal_response(request, refused.status, refused.reason)
        # Up to 16 connections each with a body of megabytes: what a run's bodies hold on the host at once is
        # bounded, refused unread past it.
        size = self._declared_size(request)
        if run.bytes_in_flight + size > self._max_bytes_in_flight:
            return self._too_much_at_once(run, request)
        run.bytes_in_flight += size
        try:
            if request.path.startswith(RUN_API_PREFIX):
                return await handle_run_api(run.endpoint, request)
            return await self._handle_llm(run, request)
        finally:
            run.bytes_in_flight -= size

    def _declared_size(self, request: web.Request) -> int:
        # The largest body either side takes (a larger declared one is refused, 413, before it is read). Every
        # body has a Content-Length here (runner/channel/request_framing.py).
        return min(request.content_length or 0, max(self._max_body_bytes, MAX_STEP_BYTES))

    def _invalid(self, run: _Run, status: int, reason: str) -> None:
        """A request neither our client nor our SDK sends: it counts against the run (logged there)."""
        if run.endpoint is not None:
            run.endpoint.invalid(status, reason)
        else:
            self._log.warning("run_request_invalid", run_id=run.run_id, status=status, reason=reason)

    def _too_much_at_once(self, run: _Run, request: web.Request) -> web.Response:
        reason = f"run {run.run_id} has {self._max_bytes_in_flight} bytes of requests in flight already"
        if request.path.startswith(RUN_API_PREFIX):
            if run.endpoint is not None:
                run.endpoint.invalid(429, reason)  # a working agent sends one body at a time
            return answer(429, False, reason)
        return ProxyError(429, "too_much_in_flight", reason).response()

    async def _handle_llm(self, run: _Run, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        if not self._live(run):
            return self._refuse(run, request, started)
        held = cap = 0
        try:
            target = self._upstream.target(request)
            if run.requests >= self._max_requests:
                reason = f"run {run.run_id} reached its limit of {self._max_requests} LLM requests"
                raise ProxyError(429, "run_request_limit", reason)
            run.requests += 1  # every request counts, refused or not: refusals cost the host work too
            body = await llm_request.read_body(request, self._max_body_bytes)
            # Held at once for what the container sent, so that calls racing this one see it while it is made safe.
            held = self._hold_input(run, len(body))
            followups = self._gate.followups(run.run_id)  # read once: the call holds for what it forwards
            left = self._max_tokens - run.tokens - run.reserved
            # Parsing, the policy's walk and serializing up to 8 MB are CPU work: never on the event loop.
            forwarded = await asyncio.to_thread(
                llm_request.prepared, self._policy, self._upstream, request.path, body, followups, left
            )
            # Then for what the host forwards (the follow-ups added), and its output for what is left after that.
            run.reserved -= held
            held = 0
            held = self._hold_input(run, len(forwarded.data), forwarded.media_tokens)
            cap = min(forwarded.output_cap, max(1, self._max_tokens - run.tokens - run.reserved))
            run.reserved += cap
            if cap < forwarded.output_cap:
                forwarded = await asyncio.to_thread(llm_request.recapped, self._policy, forwarded, cap)
        except BaseException as exc:
            run.reserved -= held + cap  # whatever ended it (a cancel too): nothing stays held
            if not isinstance(exc, ProxyError):
                raise
            if exc.error_type == INVALID_REQUEST and run.endpoint is not None:
                run.endpoint.invalid(exc.status, exc.message)  # the host's own SDK never sends one
            self._calls.call(run.run_id, request.path, exc.status, None, started, error=exc.error_type)
            return exc.response()
        if dropped := forwarded.sanitized.dropped:
            self._log.warning("llm_request_fields_dropped", run_id=run.run_id, dropped=list(dropped))
        if not self._live(run):
            run.reserved -= held + cap
            return self._refuse(run, request, started)

        try:
            # The day's allowance of its chat and of the bot: reserved here, settled once the call is recorded.
            media = forwarded.media_tokens
            async with self._allowance.call(run.run_id, run.payer, len(forwarded.data), cap, media) as call:
                return await self._call(run, request, target, forwarded, started, call)
        except AllowanceRefused as exc:
            self._calls.call(run.run_id, request.path, exc.status, None, started, error=exc.error_type)
            return exc.response()
        finally:
            # Released only after _call recorded the tokens: never a moment when the call counts for nothing.
            run.reserved -= held + cap

    async def _call(
        self, run: _Run, request: web.Request, target: str, forwarded: Forwarded, started: float, call: Call
    ) -> web.StreamResponse:
        answering = self._upstream.answer(request, target, forwarded.payload, forwarded.data, call)
        try:
            response = await self._guarded(run, answering)
        except (_RunClosed, ProxyError) as exc:
            error = exc if isinstance(exc, ProxyError) else _closed_error(run.run_id)
            await self._record(run, call.usage)
            if call.stream is not None:
                return await self._end_stream(run, request, call, error, started)
            self._calls.call(run.run_id, request.path, error.status, None, started, error=error.error_type)
            return error.response()

        await self._record(run, call.usage)
        if call.stream is None and not self._live(run):
            # The answer came back after the run was closed: the tokens are spent (recorded) but not delivered.
            return self._refuse(run, request, started)
        self._calls.call(run.run_id, request.path, response.status, call.usage, started, stream=call.stream is not None)
        return response

    def _hold_input(self, run: _Run, body_bytes: int, media_tokens: int = 0) -> int:
        try:
            estimate = input_hold(self._max_tokens, run.tokens, run.reserved, body_bytes, media_tokens)
        except BudgetSpent:
            if not run.budget_told:  # once per run: the manager ends it; the 429 tells the container why
                run.budget_told = True
                self._budget_notices.tell(run.run_id)
            raise
        run.reserved += estimate
        return estimate

    async def _guarded(self, run: _Run, work: Awaitable[web.StreamResponse]) -> web.StreamResponse:
        """Run the call as a task the run owns; cancel it as soon as the run stops being live."""
        task: asyncio.Task[web.StreamResponse] = asyncio.ensure_future(work)
        run.calls.add(task)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self._gate_poll_seconds)
                if not task.done() and not self._live(run):
                    task.cancel()
                    await asyncio.wait({task})  # let it unwind: that closes the upstream connection
            if task.cancelled():
                raise _RunClosed
            return task.result()
        finally:
            run.calls.discard(task)
            if not task.done():
                task.cancel()  # our own handler was cancelled (the container hung up)

    # -- answers and bookkeeping ------------------------------------------------------------------

    def _refuse(self, run: _Run, request: web.Request, started: float) -> web.Response:
        error = _closed_error(run.run_id)
        self._calls.call(run.run_id, request.path, error.status, None, started, error=error.error_type)
        return error.response()

    async def _end_stream(
        self, run: _Run, request: web.Request, call: Call, error: ProxyError, started: float
    ) -> web.StreamResponse:
        """A stream already under way cannot become a 403 or 502: end it with an error event the SDKs raise on."""
        stream = call.stream
        assert stream is not None  # called only once the relay has started
        with contextlib.suppress(ConnectionError, RuntimeError):
            await stream.write(self._upstream.stream_error_event(error).encode())
            await stream.write_eof()
        error_type = f"{error.error_type}_mid_stream"
        self._calls.call(run.run_id, request.path, stream.status, call.usage, started, error=error_type, stream=True)
        return stream

    async def _record(self, run: _Run, usage: Usage) -> None:
        run.tokens += usage.input_tokens + usage.output_tokens
        try:
            await self._sink.record_usage(run.run_id, usage.input_tokens, usage.output_tokens, 1)
        except Exception:
            # Bookkeeping must not turn a good answer into an error; the log keeps the numbers.
            self._log.exception(
                "llm_usage_not_recorded",
                run_id=run.run_id,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
            )
