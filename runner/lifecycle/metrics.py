"""Prometheus metrics of the subagent system, in a registry of the app's own (no global state).

Names follow Prometheus conventions: a `crewbot_` prefix, units in the name (`_seconds`, `_bytes`),
`_total` on counters; labels take a handful of values (an outcome, a cap, a direction), never a chat id.
The gauges read the live state when scraped, so they cannot drift from what the manager counts.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.mcp_client import CallOutcome
from core.store.run_files import Direction
from core.store.runs import RunStatus
from core.store.spend import SpendKind

# Seconds: a queue wait or a start is short, a run lasts up to SUBAGENT_TIMEOUT_SECONDS (900 s by default).
LATENCY_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS_SECONDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
MEMORY_BUCKETS_BYTES = tuple(float(mib * 1024 * 1024) for mib in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096))
CPU_BUCKETS_SECONDS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0)
# Seconds from a turn's start to its first words on screen: a model's first tokens come in about a second,
# a slow one or a long prompt takes several (bench: streaming measures it).
FIRST_TEXT_BUCKETS_SECONDS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)


class StreamShown:
    """The `shown` label of a streamed answer: a message edited as it grows (groups), or a draft (private chats)."""

    MESSAGE = "message"
    DRAFT = "draft"


class CapKind:
    """The `cap` label of a refusal."""

    GLOBAL = "global"  # MAX_CONCURRENT_SUBAGENTS
    CHAT = "chat"  # MAX_SUBAGENTS_PER_CHAT


class RunMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.running = Gauge("crewbot_subagents_running", "Subagent containers running now", registry=r)
        self.queued = Gauge("crewbot_subagents_queued", "Runs accepted whose container has not started", registry=r)
        self.max_concurrent = Gauge(
            "crewbot_subagents_max_concurrent", "MAX_CONCURRENT_SUBAGENTS in effect (changeable live)", registry=r
        )
        self.max_per_chat = Gauge(
            "crewbot_subagents_max_per_chat", "MAX_SUBAGENTS_PER_CHAT in effect (changeable live)", registry=r
        )
        self.runs = Counter("crewbot_subagent_runs", "Runs by their final status", ["outcome"], registry=r)
        self.refusals = Counter("crewbot_subagent_refusals", "Spawn requests refused by a cap", ["cap"], registry=r)
        self.tokens = Counter("crewbot_subagent_llm_tokens", "LLM tokens used by subagents", ["direction"], registry=r)
        self.llm_tokens = Counter(
            "crewbot_llm_tokens",
            "LLM tokens counted against the daily allowances, by kind of work (main, announce, subagent, scheduled)",
            ["kind", "direction"],
            registry=r,
        )
        self.daily_tokens_used = Gauge(
            "crewbot_daily_tokens_used", "LLM tokens the whole bot used today (the day of TIMEZONE)", registry=r
        )
        self.daily_tokens_allowance = Gauge(
            "crewbot_daily_tokens_allowance", "DAILY_TOKENS in effect, the whole bot's (0: none)", registry=r
        )
        self.files = Counter(
            "crewbot_subagent_files",
            "Chat files given to runs (in) and files runs sent (out)",
            ["direction"],
            registry=r,
        )
        self.file_bytes = Counter(
            "crewbot_subagent_file_bytes",
            "Bytes of the files given to runs (in) and sent (out)",
            ["direction"],
            registry=r,
        )
        self.egress_connections = Counter(
            "crewbot_subagent_egress_connections",
            "Connections runs asked the egress door for, allowed or refused",
            ["outcome"],
            registry=r,
        )
        self.egress_bytes = Counter(
            "crewbot_subagent_egress_bytes",
            "Bytes through the egress door: up (from containers), down (to them)",
            ["direction"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "crewbot_subagent_queue_wait_seconds",
            "Request recorded -> run started (run start minus request creation)",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.start_latency = Histogram(
            "crewbot_subagent_start_latency_seconds",
            "Run started -> the engine's container start returned",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.duration = Histogram(
            "crewbot_subagent_run_duration_seconds",
            "Run started -> outcome recorded",
            buckets=DURATION_BUCKETS_SECONDS,
            registry=r,
        )
        self.cancel_latency = Histogram(
            "crewbot_subagent_cancel_latency_seconds",
            "Cancel asked -> container confirmed stopped",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.memory_peak = Histogram(
            "crewbot_subagent_memory_peak_bytes",
            "Peak memory of a run's container (runs whose peak is known)",
            buckets=MEMORY_BUCKETS_BYTES,
            registry=r,
        )
        self.cpu = Histogram(
            "crewbot_subagent_cpu_seconds",
            "CPU time of a run's container (runs whose figure is known)",
            buckets=CPU_BUCKETS_SECONDS,
            registry=r,
        )
        self.stream_first_text = Histogram(
            "crewbot_stream_first_text_seconds",
            "Streamed answer: the turn's start -> its first words visible in the chat",
            ["shown"],
            buckets=FIRST_TEXT_BUCKETS_SECONDS,
            registry=r,
        )
        # Labels: the operator's server and tool names (at most MAX_TOOLS_OFFERED tools a server), never a chat, and
        # never a name a container sent: a call of a tool no server offered is counted as server and tool "-".
        self.mcp_calls = Counter(
            "crewbot_mcp_tool_calls",
            "MCP tool calls by server, tool and outcome",
            ["server", "tool", "outcome"],
            registry=r,
        )
        self.mcp_seconds = Histogram(
            "crewbot_mcp_tool_call_seconds",
            "One MCP tool call, from the call to its result (or its timeout)",
            ["server"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.stream_edits = Counter(
            "crewbot_stream_edits",
            "Writes of streamed answers (the first send, each edit or draft; not the final text): rate() is edits "
            "per second, all chats together",
            ["shown"],
            registry=r,
        )
        for shown in (StreamShown.MESSAGE, StreamShown.DRAFT):
            self.stream_first_text.labels(shown=shown)
            self.stream_edits.labels(shown=shown)
        for status in RunStatus:  # every outcome is a series from the start, so rate() sees its first run
            if status not in {RunStatus.QUEUED, RunStatus.RUNNING}:
                self.runs.labels(outcome=status.value)
        for cap in (CapKind.GLOBAL, CapKind.CHAT):
            self.refusals.labels(cap=cap)
        for direction in ("input", "output"):
            self.tokens.labels(direction=direction)
            for kind in SpendKind:
                self.llm_tokens.labels(kind=kind.value, direction=direction)
        for outcome in ("allowed", "refused"):
            self.egress_connections.labels(outcome=outcome)
        for egress_direction in ("up", "down"):
            self.egress_bytes.labels(direction=egress_direction)
        for file_direction in Direction:
            self.files.labels(direction=file_direction.value)
            self.file_bytes.labels(direction=file_direction.value)

    def refused(self, chat_cap: bool) -> None:
        """A spawn refused before it became a request (the caps and the queue were full)."""
        self.refusals.labels(cap=CapKind.CHAT if chat_cap else CapKind.GLOBAL).inc()

    def watch(
        self,
        *,
        running: Callable[[], int],
        queued: Callable[[], int],
        max_concurrent: Callable[[], int],
        max_per_chat: Callable[[], int],
    ) -> None:
        """The gauges read these when scraped."""
        self.running.set_function(lambda: float(running()))
        self.queued.set_function(lambda: float(queued()))
        self.max_concurrent.set_function(lambda: float(max_concurrent()))
        self.max_per_chat.set_function(lambda: float(max_per_chat()))

    def watch_pool(self, counts: Callable[[], tuple[int, int, int, int]], target: Callable[[], int]) -> None:
        """The warm pool's gauges and counters, read from it when scraped: (ready, starting, hits, misses)."""
        r = self.registry
        pool = {
            "crewbot_warm_pool_ready": ("Warm pool containers ready for a run", lambda: counts()[0]),
            "crewbot_warm_pool_starting": ("Warm pool containers starting", lambda: counts()[1]),
            "crewbot_warm_pool_target": ("SUBAGENT_WARM_POOL in effect", target),
            "crewbot_warm_pool_hits": ("Runs that took a ready container since the start", lambda: counts()[2]),
            "crewbot_warm_pool_misses": ("Runs started cold with the pool on, since the start", lambda: counts()[3]),
        }
        for name, (text, read) in pool.items():
            Gauge(name, text, registry=r).set_function(lambda read=read: float(read()))  # type: ignore[misc]

    def watch_turns(self, counts: Callable[[], tuple[int, int]], limit: int) -> None:
        """The main agent's turns, read from the engine when scraped: (running, chats waiting for a slot)."""
        r = self.registry
        Gauge("crewbot_turns_running", "Main-agent turns running now", registry=r).set_function(
            lambda: float(counts()[0])
        )
        Gauge("crewbot_turns_waiting", "Chats waiting for a turn slot (MAX_CONCURRENT_TURNS)", registry=r).set_function(
            lambda: float(counts()[1])
        )
        Gauge("crewbot_turns_max_concurrent", "MAX_CONCURRENT_TURNS", registry=r).set(limit)

    def watch_allowance(self, *, used: Callable[[], int], allowance: Callable[[], int]) -> None:
        """The daily gauges read these when scraped (the whole bot's only: a chat's would be labelled by its id)."""
        self.daily_tokens_used.set_function(lambda: float(used()))
        self.daily_tokens_allowance.set_function(lambda: float(allowance()))

    def count_llm_tokens(self, kind: SpendKind, input_tokens: int, output_tokens: int) -> None:
        """One LLM call's tokens as settled against the allowances (the main agent's calls too: call this)."""
        self.llm_tokens.labels(kind=SpendKind(kind).value, direction="input").inc(max(input_tokens, 0))
        self.llm_tokens.labels(kind=SpendKind(kind).value, direction="output").inc(max(output_tokens, 0))

    def count_stream(self, first_text_seconds: float | None, edits: int, draft: bool) -> None:
        """One streamed answer, once settled: when its first words showed (None: they never did), its writes."""
        shown = StreamShown.DRAFT if draft else StreamShown.MESSAGE
        if first_text_seconds is not None:
            self.stream_first_text.labels(shown=shown).observe(max(first_text_seconds, 0.0))
        self.stream_edits.labels(shown=shown).inc(max(edits, 0))

    def count_mcp_call(self, server: str, tool: str, outcome: CallOutcome) -> None:
        """One MCP tool call (the main agent's or one a subagent made through the host), by its outcome."""
        self.mcp_calls.labels(server=server, tool=tool, outcome=outcome.status.value).inc()
        self.mcp_seconds.labels(server=server).observe(max(outcome.seconds, 0.0))

    def count_tokens(self, input_tokens: int, output_tokens: int) -> None:
        self.tokens.labels(direction="input").inc(max(input_tokens, 0))
        self.tokens.labels(direction="output").inc(max(output_tokens, 0))

    def count_files(self, direction: Direction, files: int, size_bytes: int) -> None:
        self.files.labels(direction=direction.value).inc(max(files, 0))
        self.file_bytes.labels(direction=direction.value).inc(max(size_bytes, 0))

    def count_egress(self, allowed: bool, bytes_up: int, bytes_down: int) -> None:
        self.egress_connections.labels(outcome="allowed" if allowed else "refused").inc()
        self.egress_bytes.labels(direction="up").inc(max(bytes_up, 0))
        self.egress_bytes.labels(direction="down").inc(max(bytes_down, 0))
