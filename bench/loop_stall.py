"""Event-loop stall: the longest gap a loop-lag probe sees while the host takes a flood.

A probe task sleeps PROBE_INTERVAL_SECONDS in a loop and records how late each wake-up is (its gap); a
window's figures are its longest gap and its p99 gap. The app is the real one (real PTB against the fake
Bot API in a process of its own, SQLite, outbox, task manager, LLM proxy and run channels, the IPC watcher
as runner/service.py builds it) on the in-memory container runtime (tests.fakes.memory_runtime), so no
engine work is in the figures. Everything that is not the host runs in processes of its own, started
before any window: the junk writer and the "container" (the real container.channel.RunChannel on the
run's socket), so the probe sees only the host's own work. Per round, in one worker process:

- probe alone: no app, nothing else on the loop (baseline of the baseline);
- app started, idle (baseline of the cases);
- (a) 10,000 junk .json files written into an allowed chat's tasks/ by the writer process as fast as it
  can; the window ends when all are quarantined (the writer polls tasks/ and errors/ from its side);
- (b) a spawn request whose container, as fast as it can, sends SUBAGENT_MAX_MESSAGES' default (10)
  progress messages of MAX_PROGRESS_CHARS each (all at once), hands back a valid pydantic-ai session of
  just under MAX_SESSION_BYTES and reports a result of MAX_RESULT_CHARS; the window ends once the run is
  settled and cleaned up and the chat's outbox has sent everything (progress and the result's parts);
- (b') the same with 1,000 progress messages (the setting's ceiling); that window ends when the run is
  cleaned up (the rate-limited outbox would take minutes), and its unsent progress rows are dropped after;
- a full collection, gc.collect() on the loop's thread: what an automatic one costs the loop when it comes.

Each round runs twice, in a fresh app each time: as the bot runs today, and with `gc.collect(); gc.freeze()`
once start-up is done (a mitigation to compare; the bot does not call it). Python's collections are timed
through `gc.callbacks`, so a gap can be told apart from a full (generation-2) collection that caused it.
Logging is at the production default (INFO, console format) into the worker's log file.

The parts: bench.loop_probe (the probe, the collection timer, a window's figures), bench.stall_pass (the
host app and one pass through the windows), bench.stall_junk and bench.stall_subagent (cases (a) and (b),
each with its helper process), bench.stall_peer (how the host talks to those); this module runs the rounds
and turns the passes into rows and notes.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from bench.common import BenchContext, ms
from bench.loop_probe import PROBE_INTERVAL_SECONDS, TAIL_SECONDS, GcRecorder
from bench.report import Measure, Row
from bench.stall_junk import JUNK_FILES, junk_writer
from bench.stall_pass import MODE_FROZEN, MODE_TODAY, MODES, Pass, run_pass
from bench.stall_subagent import CEILING_MAX_MESSAGES, DEFAULT_MAX_MESSAGES, container_process
from bench.tg_process import TelegramProcess
from container.protocol import MAX_PROGRESS_CHARS, MAX_RESULT_CHARS, MAX_SESSION_BYTES
from core.logging import configure_logging

NAME = "stall"
GOAL_MS = 50.0


# --- rows -----------------------------------------------------------------------------------------------

Figure = Callable[[Pass], float]


def gap_max(window: str) -> Figure:
    return lambda p: p.windows[window].max_ms


def gap_p99(window: str) -> Figure:
    return lambda p: p.windows[window].p99_ms


def fact(window: str, key: str) -> Figure:
    return lambda p: float(p.windows[window].facts[key])


def _row(
    metric: str,
    passes: list[Pass],
    result: tuple[str, Figure],
    baseline_label: str,
    baseline: tuple[str, Figure],
    unit: str = "ms",
) -> Row:
    values = [result[1](p) for p in passes if p.mode == result[0]]
    base = [baseline[1](p) for p in passes if p.mode == baseline[0]]
    return Row(
        bench=NAME,
        metric=metric,
        unit=unit,
        result=Measure.of(values),
        baseline_label=baseline_label,
        baseline=Measure.of(base),
        extra={"worst": round(max(values), 3), "baseline_worst": round(max(base), 3)},
    )


def _rows(passes: list[Pass]) -> list[Row]:
    today, frozen = MODE_TODAY, MODE_FROZEN
    junk = f"(a) {JUNK_FILES:,} junk files written into an allowed chat's tasks/"
    subagent = (
        f"(b) a subagent: {DEFAULT_MAX_MESSAGES} progress messages of {MAX_PROGRESS_CHARS:,} chars at once, "
        f"a session just under {MAX_SESSION_BYTES // (1024 * 1024)} MiB, a {MAX_RESULT_CHARS:,}-char result"
    )
    ceiling = f"(b) the same with {CEILING_MAX_MESSAGES:,} progress messages (SUBAGENT_MAX_MESSAGES' ceiling)"
    idle = (today, gap_max("idle"))
    rows = [
        _row("app started, idle: longest loop gap", passes, idle, "the probe alone, no app", (today, gap_max("alone"))),
        _row(f"{junk}: longest loop gap", passes, (today, gap_max("junk")), "app idle", idle),
        _row(f"{junk}: p99 loop gap", passes, (today, gap_p99("junk")), "app idle", (today, gap_p99("idle"))),
        _row(
            f"{junk}: first write → all quarantined",
            passes,
            (today, fact("junk", "quarantined_s")),
            "the writer alone: first → last write",
            (today, fact("junk", "write_s")),
            unit="s",
        ),
        _row(f"{subagent}: longest loop gap", passes, (today, gap_max("subagent")), "app idle", idle),
        _row(f"{ceiling}: longest loop gap", passes, (today, gap_max("ceiling")), "app idle", idle),
    ]
    as_today = "as today (no gc.freeze)"
    cases = (("idle", "app idle"), ("junk", "(a)"), ("subagent", "(b)"), ("ceiling", "(b) 1,000 messages"))
    for key, what in cases:
        rows.append(
            _row(
                f"{what}, gc.freeze() after start-up: longest loop gap",
                passes,
                (frozen, gap_max(key)),
                as_today,
                (today, gap_max(key)),
            )
        )
    collect = "a full collection, gc.collect(), on the loop (what an automatic one costs when it comes)"
    rows.append(_row(f"{collect}: longest loop gap", passes, (today, gap_max("collect")), "app idle", idle))
    rows.append(
        _row(
            "the same full collection, gc.freeze() after start-up: longest loop gap",
            passes,
            (frozen, gap_max("collect")),
            as_today,
            (today, gap_max("collect")),
        )
    )
    return rows


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _notes(ctx: BenchContext, passes: list[Pass], rounds: int, idle_seconds: float) -> None:
    ctx.note(
        f"{rounds} round(s), each as today and with gc.collect() + gc.freeze() after start-up (a fresh app each); "
        f"probe every {PROBE_INTERVAL_SECONDS * 1000:g} ms; idle windows {idle_seconds:g} s; every window ends "
        f"{TAIL_SECONDS:g} s after its work; median of the rounds' figures, p95 column = the worst round"
    )
    for p in passes:
        parts = []
        for name, w in p.windows.items():
            gc_part = f", gen-2 {w.gen2_count}x up to {w.longest_gen2_ms:.0f} ms" if w.gen2_count else ""
            parts.append(f"{name} {w.max_ms:.1f} ms ({w.longest_gap_phase()}) in {w.seconds:.1f} s{gc_part}")
        automatic = p.automatic_gen2
        longest = max((ms(pause.seconds) for pause in automatic), default=0.0)
        ctx.note(
            f"{p.mode} ({p.heap_objects:,} objects tracked after start-up; {len(automatic)} automatic full "
            f"collection(s) after it, longest {longest:.0f} ms): " + "; ".join(parts)
        )
    for mode in MODES:
        worst = max(
            w.max_ms for p in passes if p.mode == mode for k, w in p.windows.items() if k not in ("alone", "collect")
        )
        verdict = "met" if worst <= GOAL_MS else "NOT met"
        ctx.note(
            f"goal <= {GOAL_MS:g} ms {verdict} ({mode}) in the measured cases: the worst window's longest gap was "
            f"{worst:.1f} ms (the forced full collection is not a case: it shows what one costs when it comes)"
        )
    for p in passes:
        for name, w in p.windows.items():
            if w.max_ms > GOAL_MS:
                ctx.note(
                    f"{p.mode} {name}: longest gap {w.max_ms:.0f} ms ({w.longest_gap_phase()}), a collection ran "
                    f"{w.gc_in_longest_gap_ms():.0f} ms of it"
                )
    junk = [p.windows["junk"].facts for p in passes]
    sub = [p.windows["subagent"].facts for p in passes]
    ceiling = [p.windows["ceiling"].facts for p in passes]
    ctx.note(
        f"(a) the writer took {_median([float(f['write_s']) for f in junk]):.2f} s for {JUNK_FILES:,} files; "
        f"all were quarantined {_median([float(f['quarantined_s']) for f in junk]):.2f} s after its first write"
    )
    ctx.note(
        f"(b) container side (medians): {DEFAULT_MAX_MESSAGES} messages "
        f"{_median([float(f['messages_s']) for f in sub]):.3f} s, "
        f"session of {sub[0]['session_bytes']:,} bytes {_median([float(f['session_s']) for f in sub]):.3f} s, "
        f"result {_median([float(f['result_s']) for f in sub]):.3f} s; spawn → everything sent to the chat "
        f"{_median([float(f['spawn_to_sent_s']) for f in sub]):.2f} s; {CEILING_MAX_MESSAGES:,} messages took "
        f"{_median([float(f['messages_s']) for f in ceiling]):.2f} s"
    )


async def run(ctx: BenchContext) -> list[Row]:
    configure_logging(level="INFO")  # the production default: what the host logs is part of its work
    rounds = ctx.scaled(3, 1)
    idle_seconds = 3.0 if ctx.quick else 5.0
    passes: list[Pass] = []
    with GcRecorder() as recorder:
        async with TelegramProcess() as tg, junk_writer() as junk, container_process() as box:
            for round_index in range(rounds):
                # Alternate which mode goes first, so neither always runs in the older process.
                order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    started = time.perf_counter()
                    passes.append(await run_pass(ctx, tg, (junk, box), recorder, mode, len(passes), idle_seconds))
                    took = time.perf_counter() - started
                    print(
                        f"stall: pass {len(passes)}/{rounds * len(MODES)} ({mode}) took {took:.1f} s", file=sys.stderr
                    )
        print("stall: helpers stopped", file=sys.stderr)
    _notes(ctx, passes, rounds, idle_seconds)
    return _rows(passes)
