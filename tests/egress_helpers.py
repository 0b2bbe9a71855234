"""Recording a run's connections through the egress door as the recorder does (EgressStore.add, on the real
store), for the tests of what operators see of them: /subagents, `crewbot logs` and stats."""

from __future__ import annotations

import time

from core.store.db import Database
from core.store.egress import EgressRecord, EgressStore


def allowed(
    run_id: str, chat_id: int, host: str, port: int, address: str, down: int, up: int = 0, reason: str = ""
) -> EgressRecord:
    """A connection the door let through to `address`, with its bytes (and why it was cut, if it was)."""
    now = time.time()
    return EgressRecord(
        run_id=run_id, chat_id=chat_id, host=host, port=port, address=address, allowed=True, reason=reason,
        bytes_up=up, bytes_down=down, started_at=now, ended_at=now,
    )  # fmt: skip


def refused(run_id: str, chat_id: int, host: str, port: int, reason: str) -> EgressRecord:
    now = time.time()
    return EgressRecord(
        run_id=run_id, chat_id=chat_id, host=host, port=port, address=None, allowed=False, reason=reason,
        bytes_up=0, bytes_down=0, started_at=now, ended_at=now,
    )  # fmt: skip


async def record(
    db: Database, run_id: str, connections: list[EgressRecord], past_the_cap: list[EgressRecord] | None = None
) -> None:
    """The connections kept and counted, in order; those `past_the_cap` counted in the run's totals only."""
    await EgressStore(db).add(run_id, connections, connections + (past_the_cap or []))
