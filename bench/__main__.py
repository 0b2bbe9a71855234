"""`python -m bench [--only NAME ...] [--quick]`: run the benchmarks, print the table, write the JSON.

Each benchmark runs in a worker process of its own (`--worker NAME`, used by this module only) so its
peak memory and its failures stay its own; afterwards the orchestrator removes any container left
behind by that worker's chats. Results: bench/results/latest.json and a timestamped copy; worker logs:
bench/results/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from bench.common import CHATS_PER_WORKER, BenchContext
from bench.engine import remove_containers_of_chats
from bench.machine import machine_info
from bench.report import Outcome, Row, markdown_table, notes_text
from core.lean_import import import_telegram
from core.logging import configure_logging
from core.malloc_arenas import limit_malloc_arenas
from tests.fakes.loopback_guard import install_loopback_guard

BENCHMARKS: dict[str, str] = {
    "pickup": "bench.pickup",
    "spawn": "bench.spawn",
    "warm_pool": "bench.warm_pool",
    "cancel": "bench.cancel",
    "burst": "bench.burst",
    "ingest": "bench.ingest",
    "memory": "bench.memory",
    "memory_mcp": "bench.memory_mcp",
    "prompt": "bench.prompt",
    "stall": "bench.loop_stall",
    "hostile": "bench.hostile_channel",
    "files": "bench.files",
    "egress": "bench.egress",
    "questions": "bench.questions",
    "allowance": "bench.allowance",
    "markdown": "bench.markdown",
    "streaming": "bench.streaming",
    "senses": "bench.senses",
    "history": "bench.history",
    "webhook": "bench.webhook",
    "runtime_class": "bench.runtime_class",
    "kube": "bench.kube",
    "bridge": "bench.bridge",
    "kube_pool": "bench.kube_pool",
    "mcp": "bench.mcp",
}
RESULTS_DIR = Path(__file__).resolve().parent / "results"
LOGS_DIR = RESULTS_DIR / "logs"
WORKER_TIMEOUT_SECONDS = {False: 480.0, True: 240.0}
# Telegram supergroup ids are -100 followed by ten digits; each run takes a random slice of them.
SUPERGROUP_FLOOR = 1_000_000_000_000
RUN_SLICE = 100_000

BenchRun = Callable[[BenchContext], Coroutine[Any, Any, list[Row]]]


# --- worker -----------------------------------------------------------------------------------------


def _worker(name: str, out: Path, chat_base: int, quick: bool) -> int:
    configure_logging(level="WARNING")  # stderr, which the orchestrator sends to the worker's log file
    import_telegram()  # as `crewbot run` does, before anything imports it (core/lean_import.py)
    limit_malloc_arenas()  # as `crewbot run` does, before any thread starts (core/malloc_arenas.py)
    install_loopback_guard()
    run = cast(BenchRun, importlib.import_module(BENCHMARKS[name]).run)
    work_dir = Path(tempfile.mkdtemp(prefix="cb-", dir="/tmp"))  # short: Unix socket paths live below it
    ctx = BenchContext(quick=quick, chat_base=chat_base, work_dir=work_dir)
    outcome = Outcome(name)
    started = time.perf_counter()
    try:
        outcome.rows = asyncio.run(run(ctx))
    except BaseException as exc:
        traceback.print_exc()
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.duration_seconds = time.perf_counter() - started
        outcome.notes = ctx.notes
        left = remove_containers_of_chats(chat_base - CHATS_PER_WORKER + 1, chat_base)
        if left:
            outcome.notes.append(f"{left} container(s) of this benchmark were still there at its end and were removed")
        shutil.rmtree(work_dir, ignore_errors=True)
    out.write_text(json.dumps(outcome.to_json()))
    return 0 if outcome.error is None else 1


# --- orchestrator -----------------------------------------------------------------------------------


def _run_worker(name: str, chat_base: int, quick: bool, scratch: Path) -> Outcome:
    out = scratch / f"{name}.json"
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "bench", "--worker", name, "--out", str(out), "--chat-base", str(chat_base)]
    if quick:
        command.append("--quick")
    started = time.perf_counter()
    with (LOGS_DIR / f"{name}.log").open("w") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            worker.wait(timeout=WORKER_TIMEOUT_SECONDS[quick])
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)  # the worker's own process group, started just above
            worker.wait()
    remove_containers_of_chats(chat_base - CHATS_PER_WORKER + 1, chat_base)
    if out.is_file():
        return Outcome.from_json(json.loads(out.read_text()))
    failed = Outcome(
        name, error=f"worker ended with code {worker.returncode} and no result (see {LOGS_DIR}/{name}.log)"
    )
    failed.duration_seconds = time.perf_counter() - started
    return failed


def _orchestrate(names: list[str], quick: bool) -> int:
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    machine = machine_info()
    run_base = -(SUPERGROUP_FLOOR + 9_000_000_000 + secrets.randbelow(9_000) * RUN_SLICE)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="crewbot-bench-") as scratch:
        for index, name in enumerate(names):
            print(f"bench: {name} …", file=sys.stderr, flush=True)
            outcome = _run_worker(name, run_base - index * CHATS_PER_WORKER, quick, Path(scratch))
            state = "ok" if outcome.error is None else f"FAILED ({outcome.error})"
            print(f"bench: {name} {state} in {outcome.duration_seconds:.1f} s", file=sys.stderr, flush=True)
            outcomes.append(outcome)
    duration = time.perf_counter() - started
    table = markdown_table(outcomes)
    notes = notes_text(outcomes)
    print(
        f"Machine: {machine['cpu_count']} × {machine['cpu_model']}, {machine['memory_total_mib']} MiB, "
        f"Python {machine['python']}, Docker {machine['docker_server_version']}, commit {machine['git_commit']}"
        f"{' (dirty)' if machine['git_dirty'] else ''}\n"
    )
    print(table)
    if notes:
        print("\nNotes:\n" + notes)
    print(f"\nTotal runtime: {duration:.1f} s ({'quick' if quick else 'full'} run)")
    report: dict[str, Any] = {
        "schema": 1,
        "started_at": started_at.isoformat(),
        "duration_seconds": duration,
        "quick": quick,
        "benchmarks_run": names,
        "machine": machine,
        "results": [outcome.to_json() for outcome in outcomes],
        "table_markdown": table,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2)
    (RESULTS_DIR / "latest.json").write_text(text)
    (RESULTS_DIR / f"bench-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json").write_text(text)
    return 0 if all(outcome.error is None for outcome in outcomes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), metavar="NAME", help="run only NAME")
    parser.add_argument("--quick", action="store_true", help="fewer iterations: a smoke run")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--worker", choices=sorted(BENCHMARKS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--chat-base", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    if args.worker is not None:
        if args.out is None or args.chat_base is None:
            parser.error("--worker needs --out and --chat-base")
        return _worker(args.worker, args.out, args.chat_base, args.quick)
    names = [name for name in BENCHMARKS if not args.only or name in args.only]
    return _orchestrate(names, args.quick)


if __name__ == "__main__":
    sys.exit(main())
