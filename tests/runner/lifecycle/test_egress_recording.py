"""What runs did through the door, recorded: every event counted in the metrics at once, written in batches
with the run's totals, at most MAX_RECORDED_PER_RUN kept one by one; and a door opened per run only when
the settings in force at its start allow egress. Real SQLite, real doors on real sockets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from container.protocol import EGRESS_SOCKET_FILE
from core.settings import load_settings
from core.store.db import Database
from core.store.egress import EgressStore
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.egress.records import EgressEvent
from runner.lifecycle.egress_log import MAX_RECORDED_PER_RUN, EgressLog
from runner.lifecycle.metrics import RunMetrics
from runner.lifecycle.run_doors import RunDoors

RUN = "run-egress1"
CHAT = -100


def event(host: str, *, allowed: bool, down: int = 0, up: int = 0) -> EgressEvent:
    now = time.time()
    reason = "" if allowed else f"{host}:443 is not in SUBAGENT_EGRESS_ALLOW"
    return EgressEvent(
        host=host,
        port=443,
        address="127.0.0.1" if allowed else None,
        allowed=allowed,
        reason=reason,
        bytes_up=up,
        bytes_down=down,
        started_at=now,
        ended_at=now,
    )


async def open_store(tmp_path: Path) -> tuple[Database, RunStore]:
    stores = await Stores.open(load_settings(DATA_DIR=str(tmp_path)))
    await stores.chats.ensure(CHAT, "group", "g")
    runs = RunStore(stores.db)
    await runs.create(
        RUN, chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.QUEUED
    )
    return stores.db, runs


def metric(metrics: RunMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_events_are_counted_at_once_written_in_batches_and_capped(tmp_path: Path) -> None:
    db, runs = await open_store(tmp_path)
    metrics = RunMetrics()
    written: list[str] = []
    log = EgressLog(EgressStore(db), metrics, on_written=written.append)
    try:
        listen = log.listener(RUN, CHAT)
        listen(event("pypi.org", allowed=True, down=5000, up=300))
        flood = MAX_RECORDED_PER_RUN + 20  # a hostile run's refused attempts
        for n in range(flood):
            listen(event(f"evil{n}.example", allowed=False))
        # Counted at once, before anything is written (the metrics never wait for the database).
        assert metric(metrics, "crewbot_subagent_egress_connections_total", outcome="refused") == flood
        assert metric(metrics, "crewbot_subagent_egress_bytes_total", direction="down") == 5000
        assert await EgressStore(db).of_run(RUN, 10) == []
        await log.close_run(RUN)
        kept = await EgressStore(db).of_run(RUN, 10_000)
        totals = await EgressStore(db).run_totals(RUN)
        record = await runs.get(RUN)
        # After the run is closed its door's late events reach the metrics only.
        listen(event("late.example", allowed=False))
        await log.flush()
    finally:
        await log.close()
        await db.close()
    assert len(kept) == MAX_RECORDED_PER_RUN and kept[0].host == "pypi.org"
    assert (totals.connections, totals.refused, totals.bytes_down, totals.bytes_up) == (flood + 1, flood, 5000, 300)
    assert record is not None and record.egress_bytes == 5300 and record.egress_connections == flood + 1
    assert written == [RUN]  # one batch, one change for the status card
    assert metric(metrics, "crewbot_subagent_egress_connections_total", outcome="refused") == flood + 1


async def test_the_writer_flushes_a_burst_by_itself(tmp_path: Path) -> None:
    db, _ = await open_store(tmp_path)
    changed = asyncio.Event()
    log = EgressLog(EgressStore(db), RunMetrics(), on_written=lambda _: changed.set())
    log.start()
    try:
        log.listener(RUN, CHAT)(event("pypi.org", allowed=True, down=10))
        await asyncio.wait_for(changed.wait(), 10)
        assert [r.host for r in await EgressStore(db).of_run(RUN, 10)] == ["pypi.org"]
    finally:
        await log.close()
        await db.close()


async def test_a_door_is_opened_only_when_the_settings_at_the_runs_start_allow(tmp_path: Path) -> None:
    db, _ = await open_store(tmp_path)
    settings = load_settings(DATA_DIR=str(tmp_path))
    log = EgressLog(EgressStore(db), RunMetrics(), on_written=lambda _: None)
    doors = RunDoors(settings, log)
    channel = tmp_path / "channel"
    channel.mkdir()
    try:
        assert await doors.open(RUN, CHAT, channel) is None  # none: nothing listens
        assert not (channel / EGRESS_SOCKET_FILE).exists()
        # A live change (LiveConfig sets the fields in place) applies to the next run's start.
        settings.subagent_egress = type(settings.subagent_egress)("allowlist")
        settings.subagent_egress_allow = ["pypi.org", "127.0.0.1:8080"]
        settings.subagent_egress_max_mb = 3
        offer = await doors.open(RUN, CHAT, channel)
        assert offer is not None and (offer.mode, offer.allow, offer.max_bytes) == (
            "allowlist",
            ["pypi.org", "127.0.0.1:8080"],
            3 * 1024 * 1024,
        )
        assert (channel / EGRESS_SOCKET_FILE).is_socket()
        await doors.close(RUN)
        assert not (channel / EGRESS_SOCKET_FILE).exists()
    finally:
        await doors.close_all()
        await log.close()
        await db.close()


@pytest.mark.parametrize("mode", ["open", "allowlist"])
async def test_a_refused_request_through_a_real_door_is_recorded_with_its_reason(tmp_path: Path, mode: str) -> None:
    db, _ = await open_store(tmp_path)
    settings = load_settings(DATA_DIR=str(tmp_path), SUBAGENT_EGRESS=mode)
    log = EgressLog(EgressStore(db), RunMetrics(), on_written=lambda _: None)
    doors = RunDoors(settings, log)
    channel = tmp_path / "channel"
    channel.mkdir()
    try:
        await doors.open(RUN, CHAT, channel)
        reader, writer = await asyncio.open_unix_connection(str(channel / EGRESS_SOCKET_FILE))
        writer.write(b"CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 169.254.169.254:80\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        await doors.close(RUN)  # writes what its log holds
        (record,) = await EgressStore(db).of_run(RUN, 10)
    finally:
        await doors.close_all()
        await log.close()
        await db.close()
    assert answer.startswith(b"HTTP/1.1 403")
    assert (record.host, record.allowed, record.address) == ("169.254.169.254", False, None)
    assert record.reason
