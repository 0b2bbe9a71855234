"""The door says less, over its real socket: a refusal names the rule that refused and what the client asked
for, never what a name resolved to nor the host's own addresses (the event keeps those, for the operator)."""

from __future__ import annotations

import asyncio
import socket
from ipaddress import ip_address
from pathlib import Path

from core.egress_rules import EgressMode, IpAddress
from runner.egress.resolve import own_addresses
from tests.runner.egress.door_rig import LOOPBACK, Events, FakeResolver, ask, body, open_door, rules, status

PUBLIC = "93.184.215.14"  # the host's own public address, for the test's door; never connected to


async def connect_to(path: Path, target: str) -> bytes:
    return await ask(path, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())


async def test_refusals_name_the_rule_and_never_the_resolved_or_the_hosts_own_addresses(tmp_path: Path) -> None:
    # The reproduction: `vm resolves to 127.0.0.1` and `192.0.2.2 ... is this host's own address`.
    own: frozenset[IpAddress] = await asyncio.to_thread(own_addresses) | {ip_address(PUBLIC)}
    targets = sorted({*own, ip_address(LOOPBACK), ip_address("192.0.2.2")}, key=str)
    table = {"vm.test": [LOOPBACK]} | {f"own{n}.test": [str(address)] for n, address in enumerate(targets)}
    events = Events()
    path = tmp_path / "egress.sock"
    async with open_door(path, rules(EgressMode.OPEN), events, resolver=FakeResolver(table), own_addresses=own):
        answers = {name: await connect_to(path, f"{name}:443") for name in table}
        seen = await events.wait_for(len(table))
    told = b"".join(body(answer) for answer in answers.values()).decode()
    assert all(status(answer) == 403 for answer in answers.values())
    assert body(answers["vm.test"]) == b"vm.test resolves to a loopback address\n"
    assert "127.0.0.1" not in told and "192.0.2.2" not in told
    for address in own:
        assert str(address) not in told
    public = [name for name, addresses in table.items() if addresses == [PUBLIC]]
    assert body(answers[public[0]]) == f"{public[0]} resolves to the host's own address\n".encode()
    # The operator's record keeps what the client was not told.
    assert any("vm.test resolves to 127.0.0.1: 127.0.0.1 is a loopback address" in e.reason for e in seen)
    assert any(f"resolves to {PUBLIC}: {PUBLIC} is the host's own address" in e.reason for e in seen)


async def test_a_connection_that_fails_does_not_say_to_which_address(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind((LOOPBACK, 0))
        closed = probe.getsockname()[1]
    events = Events()
    path = tmp_path / "egress.sock"
    door_rules = rules(EgressMode.OPEN, [f"{LOOPBACK}:{closed}"])
    async with open_door(path, door_rules, events, resolver=FakeResolver({"gone.test": [LOOPBACK]})):
        answer = await connect_to(path, f"gone.test:{closed}")
        event = await events.next()
    assert status(answer) == 502 and LOOPBACK.encode() not in body(answer)
    assert body(answer).startswith(f"could not connect on port {closed}: ".encode())
    assert f"{LOOPBACK}: " in event.reason


async def test_the_hosts_own_private_address_reads_as_any_private_one(tmp_path: Path) -> None:
    # Asked for as a literal, an own address that is private anyway is refused as private: the answer is the
    # same as its neighbour's, so it tells the client nothing about which addresses are the host's.
    own = frozenset({ip_address("192.0.2.2"), ip_address(PUBLIC)})
    events = Events()
    path = tmp_path / "egress.sock"
    async with open_door(path, rules(EgressMode.OPEN), events, own_addresses=own):
        mine, neighbour = await connect_to(path, "192.0.2.2:443"), await connect_to(path, "192.0.2.3:443")
        public = await connect_to(path, f"{PUBLIC}:443")
    assert body(mine).replace(b"192.0.2.2", b"") == body(neighbour).replace(b"192.0.2.3", b"")
    assert b"own" not in body(mine)
    assert status(public) == 403 and body(public) == f"{PUBLIC} is the host's own address\n".encode()
