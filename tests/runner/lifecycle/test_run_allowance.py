"""Runs spend their chat's daily allowance, through the real service (real SQLite, the run's socket, the host's
model steps with the offline model) on the in-memory runtime: counted under the chat and kind of work, in the
metrics and their gauges, and a run whose chat runs out mid-run is stopped with the reason."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from container.channel import ChannelRefused, RunChannel
from container.task import RunResult
from core.store.runs import RunStatus
from core.store.spend import SCHEDULED_TURN_PREFIX, SpendKind, SpendStore
from core.stores import Stores
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.runner.lifecycle_helpers import CHAT_ID, Behaviour, Rig, rig

CHAT_ALLOWANCE = 3_000


def prompt(text: str) -> dict[str, Any]:
    return {"kind": "request", "parts": [{"part_kind": "user-prompt", "content": text}]}


def stepping(steps: int, refusals: list[str] | None = None) -> Behaviour:
    """Makes `steps` model steps, then reports; a refused step is kept in `refusals`, and the run then waits
    for the host to stop it (as the agent does after an error it cannot recover from)."""

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        for n in range(steps):
            try:
                await channel.model_step({"messages": [prompt(f"step {n}: {task.task} " + "word " * 200)]})
            except ChannelRefused as exc:
                if refusals is None:
                    raise
                refusals.append(str(exc))
                await channel.report(RunResult(status="failed", error="the model is out of reach"))
                await asyncio.Event().wait()
        await channel.report(RunResult(status="completed", result=f"{steps} steps"))
        return 0

    return behaviour


def sample(r: Rig, name: str, **labels: str) -> float:
    return r.service.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_runs_steps_are_counted_under_its_chat_and_kind_and_in_the_metrics(tmp_path: Path) -> None:
    async with rig(tmp_path, stepping(2), with_allowances=True, DAILY_TOKENS="1000000") as r:
        turn_run = await r.spawn("for a turn", turn_id="turn-1")
        scheduled_run = await r.spawn("for a task", turn_id=SCHEDULED_TURN_PREFIX + "abcd1234")
        for run_id in (turn_run, scheduled_run):
            assert await r.until_status(run_id, RunStatus.COMPLETED) == RunStatus.COMPLETED
        await r.settled()

        rows = {(row.chat_id, row.kind): row.spend for row in await SpendStore(r.stores.db).rows("0000-00-00")}
        assert set(rows) == {(CHAT_ID, SpendKind.SUBAGENT), (CHAT_ID, SpendKind.SCHEDULED)}
        for spend in rows.values():
            assert spend.calls == 2 and spend.estimated_calls == 0 and spend.input_tokens > 0
        # The run's own record and the day's spend agree: what the proxy recorded is what was spent.
        for run_id, kind in ((turn_run, SpendKind.SUBAGENT), (scheduled_run, SpendKind.SCHEDULED)):
            record = await r.service.runs.get(run_id)
            assert record is not None
            assert record.input_tokens + record.output_tokens == rows[(CHAT_ID, kind)].tokens
            counted = sample(r, "crewbot_llm_tokens_total", kind=kind.value, direction="input")
            counted += sample(r, "crewbot_llm_tokens_total", kind=kind.value, direction="output")
            assert counted == rows[(CHAT_ID, kind)].tokens
        total = sum(spend.tokens for spend in rows.values())
        assert sample(r, "crewbot_daily_tokens_used") == total
        assert sample(r, "crewbot_daily_tokens_allowance") == 1_000_000


async def test_a_run_whose_chat_runs_out_mid_run_is_stopped_with_the_reason(tmp_path: Path) -> None:
    refusals: list[str] = []
    async with rig(tmp_path, stepping(100, refusals), with_allowances=True, CHAT_DAILY_TOKENS=str(CHAT_ALLOWANCE)) as r:
        run_id = await r.spawn("step on")
        assert await r.until_status(run_id, RunStatus.INTERRUPTED, RunStatus.FAILED) == RunStatus.INTERRUPTED
        await r.settled()

        reason = f"this chat's daily allowance of {CHAT_ALLOWANCE:,} tokens is used up for today; it resets at 00:00"
        # Stopped at once: the agent may be gone before its refused step's answer reaches it; if not, it saw why.
        assert all(reason in refusal for refusal in refusals)
        record = await r.service.runs.get(run_id)
        assert record is not None and record.error is not None
        assert record.error == f"stopped: {reason} (UTC)"
        assert any(f"Interrupted: stopped: {reason}" in text for text in r.texts())  # its result says so
        assert not any("out of reach" in text for text in r.texts())  # the stop decides, not what it reported
        assert r.allowances is not None
        status = await r.allowances.status(CHAT_ID)
        steps = record.llm_requests - 1  # the last one was refused
        assert steps >= 1 and status.used >= CHAT_ALLOWANCE
        assert status.used - CHAT_ALLOWANCE <= status.used // steps  # over by less than a step's own tokens
        print(f"steps {steps}, used {status.used} of {CHAT_ALLOWANCE}: over by {status.used - CHAT_ALLOWANCE}")


async def test_without_allowances_runs_are_neither_held_nor_counted_against_a_day(tmp_path: Path) -> None:
    async with rig(tmp_path, stepping(1), CHAT_DAILY_TOKENS="1") as r:
        run_id = await r.spawn("free")
        assert await r.until_status(run_id, RunStatus.COMPLETED) == RunStatus.COMPLETED
        await r.settled()
        assert await SpendStore(r.stores.db).rows("0000-00-00") == []
        assert sample(r, "crewbot_llm_tokens_total", kind="subagent", direction="input") > 0  # still counted


async def test_after_a_restart_the_days_recorded_use_counts_and_nothing_is_held(tmp_path: Path) -> None:
    """An earlier process recorded 2,500 tokens of the chat's today and died with calls in flight: the new one
    starts from what was recorded (the gauge shows it at once), and its runs have the rest, no more, no less."""

    async def earlier_process(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        today = datetime.now(ZoneInfo("UTC")).strftime("%Y-%m-%d")
        await SpendStore(stores.db).add(today, CHAT_ID, SpendKind.MAIN, 2_000, 500, estimated=False)

    async with rig(
        tmp_path, stepping(1), prepare=earlier_process, with_allowances=True, CHAT_DAILY_TOKENS=str(CHAT_ALLOWANCE)
    ) as r:
        assert sample(r, "crewbot_daily_tokens_used") == 2_500
        assert r.allowances is not None
        held = await r.allowances.reserve(CHAT_ID, SpendKind.SUBAGENT, CHAT_ALLOWANCE)
        assert held.tokens == CHAT_ALLOWANCE - 2_500  # the rest of the day, none of it held by the dead calls
        await r.allowances.release(held)
