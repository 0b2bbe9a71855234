"""A proxy whose subagent calls reserve against the daily allowances on real SQLite, FakeLLM as the provider:
what the allowance tests and the allowance race bench (bench/allowance_race.py) share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from core.allowances import Allowances
from core.settings import load_settings
from core.store.spend import SpendKind, SpendStore
from core.stores import Stores
from runner.channel.llm_allowance import Payer, ProxyAllowance
from runner.channel.llm_policy import RequestPolicy
from runner.channel.llm_proxy import LlmProxy
from runner.lifecycle.metrics import RunMetrics
from tests.fakes.llm_server import FakeLLM
from tests.runner.llm_proxy_helpers import MODEL, PLENTY, Gate, Sink, fake_openai

DAY = "2026-11-26"
NOON = datetime.fromisoformat(f"{DAY}T12:00").replace(tzinfo=ZoneInfo("UTC")).timestamp()


@dataclass
class Told:
    """on_spent: the runs the manager was told to stop, with the reason."""

    runs: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, run_id: str, reason: str) -> None:
        self.runs.append((run_id, reason))


@dataclass
class Proxied:
    proxy: LlmProxy
    allowances: Allowances
    spend: SpendStore
    stores: Stores
    metrics: RunMetrics
    told: Told
    gate: Gate
    tmp_path: Path

    async def open(self, run_id: str, payer: Payer | None) -> Path:
        self.gate.live.add(run_id)
        socket = self.tmp_path / f"{run_id}.sock"
        await self.proxy.open_run(run_id, socket, payer=payer)
        return socket

    async def rows(self) -> dict[tuple[int, SpendKind], tuple[int, int, int, int]]:
        return {
            (row.chat_id, row.kind): (
                row.spend.input_tokens,
                row.spend.output_tokens,
                row.spend.calls,
                row.spend.estimated_calls,
            )
            for row in await self.spend.rows(DAY)
        }

    def counted(self, kind: SpendKind, direction: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "crewbot_llm_tokens_total", {"kind": kind.value, "direction": direction}
        )
        return value or 0.0


def allowances_on(stores: Stores, **settings: str) -> Allowances:
    """The allowances as the bot builds them, at noon on DAY."""
    return Allowances(load_settings(DATA_DIR="unused", **settings), SpendStore(stores.db), clock=lambda: NOON)


@asynccontextmanager
async def proxied(tmp_path: Path, llm: FakeLLM, **settings: str) -> AsyncIterator[Proxied]:
    """A proxy whose calls reserve against allowances on real SQLite; `settings` set the allowances."""
    stores = await Stores.open(load_settings(DATA_DIR=str(tmp_path / "data")))
    allowances = allowances_on(stores, **settings)
    metrics, told, gate = RunMetrics(), Told(), Gate()
    upstream = fake_openai(llm)
    proxy = LlmProxy(
        upstream,
        gate,
        Sink(),
        policy=RequestPolicy(upstream.provider, MODEL, allow_provider_tools=False),
        max_tokens_per_run=PLENTY,
        gate_poll_seconds=0.05,
        allowance=ProxyAllowance(allowances, counter=metrics, on_spent=told),
    )
    try:
        yield Proxied(proxy, allowances, SpendStore(stores.db), stores, metrics, told, gate, tmp_path)
    finally:
        await proxy.close()
        await stores.db.close()
