"""Where a request may go, decided without connecting anywhere: what was asked for against the rules, then
each resolved address against the address check (public only, unless listed as ip:port)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading

import pytest

from core.egress_rules import SPECIAL_PURPOSE_RANGES, EgressMode, IpAddress
from runner.egress.refusal import BAD_GATEWAY, FORBIDDEN, GATEWAY_TIMEOUT, Refused
from runner.egress.resolve import SystemLookups, checked_addresses, lookup_bytes, own_addresses, request_check
from tests.runner.egress.door_rig import FakeResolver, rules

PUBLIC = "93.184.215.14"  # never connected to: these tests stop at the decision
OTHER_PUBLIC = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"
OPEN = rules(EgressMode.OPEN)


def ip(text: str) -> IpAddress:
    return ipaddress.ip_address(text)


async def refused(*args: object, **kwargs: object) -> Refused:
    with pytest.raises(Refused) as caught:
        await checked_addresses(*args, **kwargs)  # type: ignore[arg-type]
    return caught.value


async def test_open_mode_allows_any_public_name() -> None:
    resolver = FakeResolver({"anything.example": [PUBLIC, OTHER_PUBLIC]})
    request_check(OPEN, "anything.example", 8443)
    found = await checked_addresses(OPEN, "anything.example", 8443, resolver=resolver, own=frozenset())
    assert found == [ip(PUBLIC), ip(OTHER_PUBLIC)]
    assert resolver.calls == ["anything.example"]


@pytest.mark.parametrize("private", ["10.0.0.5", "192.168.1.1", "127.0.0.1", "169.254.169.254", "fd00:ec2::254"])
async def test_a_name_resolving_to_a_private_address_is_refused_even_when_the_name_is_listed(private: str) -> None:
    listed = rules(EgressMode.ALLOWLIST, ["intranet.test"])
    request_check(listed, "intranet.test", 443)
    resolver = FakeResolver({"intranet.test": [private]})
    for mode_rules in (listed, OPEN):
        refusal = await refused(mode_rules, "intranet.test", 443, resolver=resolver, own=frozenset())
        assert refusal.status == FORBIDDEN
        assert private not in refusal.reason and refusal.reason.startswith("intranet.test resolves to ")
        assert refusal.detail.startswith(f"intranet.test resolves to {private}: ")


async def test_a_private_address_listed_as_ip_port_is_reached_on_that_port_only() -> None:
    listed = rules(EgressMode.OPEN, ["10.0.0.5:8080"])
    resolver = FakeResolver({"intranet.test": ["10.0.0.5"]})
    assert await checked_addresses(listed, "intranet.test", 8080, resolver=resolver, own=frozenset()) == [
        ip("10.0.0.5")
    ]
    refusal = await refused(listed, "intranet.test", 8081, resolver=resolver, own=frozenset())
    assert "private" in refusal.reason


async def test_of_a_mixed_answer_only_the_passing_addresses_are_kept_in_order() -> None:
    resolver = FakeResolver({"mixed.test": ["10.0.0.1", PUBLIC, "127.0.0.1"]})
    assert await checked_addresses(OPEN, "mixed.test", 443, resolver=resolver, own=frozenset()) == [ip(PUBLIC)]


async def test_an_answer_with_no_passing_address_is_refused_with_the_first_ones_reason() -> None:
    resolver = FakeResolver({"private.test": ["169.254.169.254", "10.0.0.1"]})
    refusal = await refused(OPEN, "private.test", 80, resolver=resolver, own=frozenset())
    assert refusal.reason == "private.test resolves to the cloud metadata service"
    assert "169.254.169.254 is the cloud metadata service" in refusal.detail


async def test_the_hosts_own_public_address_is_refused() -> None:
    resolver = FakeResolver({"me.test": [PUBLIC]})
    refusal = await refused(OPEN, "me.test", 443, resolver=resolver, own=frozenset({ip(PUBLIC)}))
    assert refusal.reason == "me.test resolves to the host's own address"
    assert refusal.detail == f"me.test resolves to {PUBLIC}: {PUBLIC} is the host's own address"


async def test_the_hosts_own_private_address_is_refused_as_any_private_one() -> None:
    # Not `the host's own address`: that would tell a client which of the private addresses are the host's.
    resolver = FakeResolver({"me.test": ["10.0.0.7"], "other.test": ["10.0.0.8"]})
    own = frozenset({ip("10.0.0.7")})
    mine = await refused(OPEN, "me.test", 443, resolver=resolver, own=own)
    other = await refused(OPEN, "other.test", 443, resolver=resolver, own=own)
    assert mine.reason.replace("me.test", "") == other.reason.replace("other.test", "")


async def test_a_literal_address_is_not_looked_up() -> None:
    resolver = FakeResolver({})
    assert await checked_addresses(OPEN, PUBLIC, 443, resolver=resolver, own=frozenset()) == [ip(PUBLIC)]
    assert resolver.calls == []
    refusal = await refused(OPEN, "::ffff:127.0.0.1", 443, resolver=resolver, own=frozenset())
    assert refusal.reason == "::ffff:127.0.0.1 is a loopback address"
    assert refusal.detail.startswith("127.0.0.1 is a loopback address")


async def test_a_slow_lookup_is_a_gateway_timeout() -> None:
    never = asyncio.Event()

    async def stuck(host: str, port: int) -> list[IpAddress]:
        await never.wait()
        return []

    refusal = await refused(OPEN, "slow.test", 443, resolver=stuck, own=frozenset(), seconds=0.05)
    assert refusal.status == GATEWAY_TIMEOUT and "slow.test" in refusal.reason


async def test_a_failed_or_empty_lookup_is_a_bad_gateway() -> None:
    async def fails(host: str, port: int) -> list[IpAddress]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    refusal = await refused(OPEN, "nowhere.test", 443, resolver=fails, own=frozenset())
    assert refusal.status == BAD_GATEWAY and "did not resolve" in refusal.reason
    empty = await refused(OPEN, "empty.test", 443, resolver=FakeResolver({"empty.test": []}), own=frozenset())
    assert empty.status == BAD_GATEWAY


def test_a_name_is_matched_by_name_patterns_only() -> None:
    # The example: localhost:8080 is refused when only 127.0.0.1:8080 is allowed.
    listed = rules(EgressMode.ALLOWLIST, ["127.0.0.1:8080", "*.allowed.test"])
    request_check(listed, "127.0.0.1", 8080)
    request_check(listed, "www.allowed.test", 443)
    for host, port in [("localhost", 8080), ("127.0.0.1", 8081), ("allowed.test", 443), ("www.allowed.test", 8080)]:
        with pytest.raises(Refused) as caught:
            request_check(listed, host, port)
        assert caught.value.status == FORBIDDEN and "not in SUBAGENT_EGRESS_ALLOW" in caught.value.reason


async def test_the_system_resolver_answers_localhost_with_loopback() -> None:
    lookups = SystemLookups(threads=1)
    try:
        found = await lookups.for_door()("localhost", 80)
    finally:
        lookups.close()
    assert found and all(address.is_loopback for address in found)


async def test_a_run_asking_for_names_nobody_answers_holds_only_its_own_lookups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Guard: SystemLookups.for_door's places, held until the thread returns (review finding: 8 slow names of
    # one run held every lookup thread, and every other chat's egress failed with 504).
    answered = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: object, *args: object, **kwargs: object) -> object:
        if str(host).startswith("slow"):
            answered.wait(30)  # a name server that never answers (until the test is over)
            raise socket.gaierror(socket.EAI_AGAIN, "no answer")
        return real("127.0.0.1", port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    lookups = SystemLookups(threads=4)
    hostile, other = lookups.for_door(), lookups.for_door()
    try:
        for n in range(8):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await hostile(f"slow{n}.attacker.test", 443)
        async with asyncio.timeout(5):
            found = await other("pypi.org", 443)  # another run's door still resolves at once
        assert found == [ip("127.0.0.1")]
    finally:
        answered.set()
        lookups.close()


async def test_own_addresses_include_loopback() -> None:
    mine = await asyncio.to_thread(own_addresses)
    assert ip("127.0.0.1") in mine


async def test_a_name_resolving_into_any_special_purpose_range_is_refused_without_saying_where() -> None:
    samples = [network[-1] for network, _ in SPECIAL_PURPOSE_RANGES] + [ip("168.63.129.16"), ip("fec0::1")]
    resolver = FakeResolver({f"n{n}.test": [str(address)] for n, address in enumerate(samples)})
    for n, address in enumerate(samples):
        refusal = await refused(OPEN, f"n{n}.test", 443, resolver=resolver, own=frozenset())
        assert refusal.status == FORBIDDEN and str(address) not in refusal.reason
        assert refusal.reason.startswith(f"n{n}.test resolves to a") and str(address) in refusal.detail


async def test_a_special_purpose_address_listed_as_ip_port_is_reached() -> None:
    listed = rules(EgressMode.OPEN, ["168.63.129.16:80", "[fec0::1]:443"])
    resolver = FakeResolver({"azure.test": ["168.63.129.16"], "site.test": ["fec0::1"]})
    assert await checked_addresses(listed, "azure.test", 80, resolver=resolver, own=frozenset()) == [
        ip("168.63.129.16")
    ]
    assert await checked_addresses(listed, "site.test", 443, resolver=resolver, own=frozenset()) == [ip("fec0::1")]
    refusal = await refused(listed, "azure.test", 443, resolver=resolver, own=frozenset())
    assert refusal.reason == "azure.test resolves to a special-purpose address"


def test_a_lookup_is_counted_as_its_name_and_the_messages_around_it() -> None:
    longest = "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61  # 253 bytes
    assert lookup_bytes("a.test") < lookup_bytes(longest) == 4 * (253 + 48)
