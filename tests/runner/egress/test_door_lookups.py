"""The door meters DNS, over its real socket: a run's lookups are capped (MAX_LOOKUPS_PER_RUN; more are
answered 429 before any lookup), each counted in the run's records and, as its name and the messages
around it, in its byte budget; a literal address is no lookup."""

from __future__ import annotations

from pathlib import Path

from core.egress_rules import EgressMode
from core.settings import load_settings
from core.store.egress import EgressStore
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.egress.records import MAX_LOOKUPS_PER_RUN, EgressEvent, lookups_reason
from runner.egress.resolve import lookup_bytes
from runner.lifecycle.egress_log import EgressLog
from runner.lifecycle.metrics import RunMetrics
from tests.runner.egress.door_rig import (
    LOOPBACK,
    Events,
    FakeResolver,
    ask,
    body,
    echo_server,
    open_door,
    rules,
    status,
    tunnel,
)

RUN = "run-lookups1"
CHAT = -100
NAMES = 300  # the reproduction: 300 lookups of chosen 250-byte names


def long_name(n: int) -> str:
    """A valid 250-byte name of its own: four labels of at most 63 bytes."""
    head = f"n{n:03d}" + "a" * 58
    return ".".join([head, "b" * 63, "c" * 63, "d" * 56, "test"])


async def connect_to(path: Path, target: str) -> bytes:
    return await ask(path, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())


async def test_300_lookups_of_long_names_are_capped_counted_and_recorded(tmp_path: Path) -> None:
    stores = await Stores.open(load_settings(DATA_DIR=str(tmp_path)))
    await stores.chats.ensure(CHAT, "group", "g")
    runs = RunStore(stores.db)
    await runs.create(
        RUN, chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.QUEUED
    )
    names = [long_name(n) for n in range(NAMES)]
    resolver = FakeResolver({name: ["10.0.0.1"] for name in names})  # refused: nothing is connected to
    log = EgressLog(EgressStore(stores.db), RunMetrics(), on_written=lambda _: None)
    events = Events()

    listen = log.listener(RUN, CHAT)

    def both(event: EgressEvent) -> None:
        events(event)
        listen(event)

    path = tmp_path / "egress.sock"
    try:
        async with open_door(path, rules(EgressMode.OPEN), both, resolver=resolver) as door:
            answers = [await connect_to(path, f"{name}:443") for name in names]
            seen = await events.wait_for(NAMES)
            used, made = door.bytes_used, door.lookups_made
        await log.close_run(RUN)
        totals = await EgressStore(stores.db).run_totals(RUN)
    finally:
        await log.close()
        await stores.db.close()
    assert len(resolver.calls) == made == MAX_LOOKUPS_PER_RUN
    codes = [status(answer) for answer in answers]
    assert codes == [403] * MAX_LOOKUPS_PER_RUN + [429] * (NAMES - MAX_LOOKUPS_PER_RUN)
    assert body(answers[-1]) == (lookups_reason(MAX_LOOKUPS_PER_RUN) + "\n").encode()
    assert f"{MAX_LOOKUPS_PER_RUN} DNS lookups" in lookups_reason(MAX_LOOKUPS_PER_RUN)
    # Each lookup is counted in the budget as its name and the messages around it, and shows in the records.
    assert used == MAX_LOOKUPS_PER_RUN * lookup_bytes(names[0]) == sum(event.bytes_up for event in seen)
    assert sum(event.lookups for event in seen) == MAX_LOOKUPS_PER_RUN
    assert (totals.lookups, totals.connections, totals.refused, totals.bytes_up) == (
        MAX_LOOKUPS_PER_RUN,
        NAMES,
        NAMES,
        used,
    )


async def test_a_lookup_that_would_spend_the_budget_is_not_made(tmp_path: Path) -> None:
    names = [long_name(n) for n in range(4)]
    resolver = FakeResolver({name: ["10.0.0.1"] for name in names})
    events = Events()
    path = tmp_path / "egress.sock"
    budget = 2 * lookup_bytes(names[0]) + 10  # two lookups, and not a third
    async with open_door(path, rules(EgressMode.OPEN, max_bytes=budget), events, resolver=resolver) as door:
        answers = [await connect_to(path, f"{name}:443") for name in names]
        await events.wait_for(len(names))
        assert door.bytes_used == budget
    assert [status(answer) for answer in answers] == [403, 403, 403, 403]
    assert resolver.calls == names[:2]
    assert all(b"SUBAGENT_EGRESS_MAX_MB" in body(answer) for answer in answers[2:])


async def test_a_literal_address_is_no_lookup_and_passes_after_the_cap(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        door_rules = rules(EgressMode.ALLOWLIST, ["*.allowed.test", target], max_lookups=1)
        resolver = FakeResolver({"a.allowed.test": ["10.0.0.1"], "b.allowed.test": ["10.0.0.1"]})
        async with open_door(path, door_rules, events, resolver=resolver) as door:
            first = await connect_to(path, "a.allowed.test:443")
            second = await connect_to(path, "b.allowed.test:443")
            not_listed = await connect_to(path, "c.other.test:443")  # refused by the rules: no lookup either
            async with tunnel(path, target) as (reader, writer):
                writer.write(b"ping")
                assert await reader.readexactly(4) == b"ping"
            assert door.lookups_made == 1
    assert (status(first), status(second), status(not_listed)) == (403, 429, 403)
    assert resolver.calls == ["a.allowed.test"] and echo.accepted == 1
