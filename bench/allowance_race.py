"""The follow-up allowance race (part of `--only hostile`): how far racing subagent calls overshoot their chat's
daily allowance when the host adds the chat's follow-ups to each.

The real LlmProxy with the real Allowances on SQLite (tests/runner/allowance_rig.py), the scripted FakeLLM as
the provider (tests/fakes), which bills each call the most it can cost: a token a byte of its text as UTF-8,
and its whole output cap. Two races
per round, each on a fresh store against a chat allowance of 50,000 tokens: 16 tiny calls of one run at once
(its connection cap; the review's race) and 50 calls of five runs (ten each). Each with the review's follow-ups
(ten of 2,000 characters, the chat's `send` to the run, added by the host to every call) and, as the baseline
in the same round, with none. The figure is the overshoot (tokens used past the allowance) in calls: the rule
(core/allowances.py) is at most one. Held for the container's body alone, the 16 follow-up calls were all
admitted and used 1.6x the allowance.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

from bench.common import BenchContext
from bench.report import Measure, Row
from core.allowances import tokens_of_bytes
from runner.channel.llm_allowance import Payer
from tests.fakes.llm_server import FakeLLM, openai_text
from tests.runner.allowance_rig import proxied
from tests.runner.llm_proxy_helpers import API_KEY, CHAT, post

NAME = "hostile"
ALLOWANCE_TOKENS = 50_000
CHAT_ID = -100
MAX_TOKENS = 40  # each call's output cap
ASK = {**CHAT, "max_tokens": MAX_TOKENS}
FOLLOWUPS = ["words and more words " * 100] * 10  # ten of 2,000 characters
RACES = {"16 calls of one run": (1, 16), "50 calls of five runs": (5, 10)}  # runs, calls each
JITTER_SECONDS = 0.02


async def _billed(body: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0, JITTER_SECONDS))
    billed = tokens_of_bytes(len(json.dumps(body, ensure_ascii=False).encode()))
    return openai_text("done", prompt_tokens=billed, completion_tokens=body["max_tokens"])


async def race(work_dir: Path, runs: int, calls: int, followups: list[str]) -> dict[str, float]:
    """One race on a fresh store: the overshoot in tokens and in calls (of the largest admitted call)."""
    async with FakeLLM(api_key=API_KEY) as llm:
        llm.openai.handle_with(_billed)
        async with proxied(work_dir, llm, CHAT_DAILY_TOKENS=str(ALLOWANCE_TOKENS)) as made:
            made.gate.notes.extend(followups)
            sockets = [await made.open(f"run-race-{n:02d}", Payer.of_run(CHAT_ID, None)) for n in range(runs)]
            await asyncio.gather(*(post(sockets[n % runs], "/v1/chat/completions", ASK) for n in range(runs * calls)))
            forwarded = llm.requests("/v1/chat/completions")
            used = (await made.allowances.status(CHAT_ID)).used
    one_call = max(tokens_of_bytes(len(json.dumps(call.body, ensure_ascii=False))) + MAX_TOKENS for call in forwarded)
    overshoot = max(0, used - ALLOWANCE_TOKENS)
    return {"admitted": len(forwarded), "overshoot": overshoot, "calls": overshoot / one_call}


async def allowance_race(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(5, 2)
    rows: list[Row] = []
    for label, (runs, calls) in RACES.items():
        with_notes: list[dict[str, float]] = []
        without: list[dict[str, float]] = []
        for index in range(rounds):
            base = ctx.work_dir / f"race-{runs}-{index}"
            with_notes.append(await race(base / "notes", runs, calls, FOLLOWUPS))
            without.append(await race(base / "none", runs, calls, []))
        worst = max(r["calls"] for r in with_notes)
        ctx.note(
            f"{label}: admitted {[int(r['admitted']) for r in with_notes]} with the follow-ups, "
            f"{[int(r['admitted']) for r in without]} without; overshoot in tokens "
            f"{[int(r['overshoot']) for r in with_notes]} / {[int(r['overshoot']) for r in without]}; goal <= 1 call "
            f"{'met' if worst <= 1 else 'NOT met'} (worst {worst:.2f})"
        )
        rows.append(
            Row(
                bench=NAME,
                metric=f"{label} against a chat's allowance, each with ten follow-ups: overshoot",
                unit="calls",
                result=Measure.of([r["calls"] for r in with_notes]),
                baseline_label="the same race without follow-ups, same round",
                baseline=Measure.of([r["calls"] for r in without]),
            )
        )
    return rows
