"""The address check of egress: an IPv4-mapped address is the IPv4 address it carries, a 6to4 address is not
(it names a network behind that IPv4 address) and is refused when the IPv4 address it is routed to would be."""

from __future__ import annotations

import ipaddress

import pytest

from core.egress_rules import (
    AddressRefusal,
    EgressMode,
    address_refusal,
    entry_allows,
    literal_address,
    parse_entry,
    request_refusal,
    unwrapped,
)

LISTED = (parse_entry("127.0.0.1:8080"), parse_entry("10.0.0.5:80"))


def detail(refusal: AddressRefusal | None) -> str:
    return "" if refusal is None else refusal.detail


def test_an_ipv4_mapped_address_is_its_ipv4_address() -> None:
    mapped = ipaddress.ip_address("::ffff:127.0.0.1")
    assert unwrapped(mapped) == ipaddress.ip_address("127.0.0.1")
    assert address_refusal(mapped, 8080, LISTED) is None
    assert entry_allows(LISTED[0], "[::ffff:127.0.0.1]", 8080)
    assert "loopback" in detail(address_refusal(mapped, 8081, LISTED))


@pytest.mark.parametrize("address", ["2002:7f00:1::", "2002:7f00:1:ffff::5", "2002:a00:5::1"])
def test_a_6to4_address_is_not_matched_by_the_ipv4_entry_it_carries(address: str) -> None:
    # Listing 127.0.0.1:8080 must not open a whole 6to4 network: the door would connect to the IPv6 address.
    six = ipaddress.ip_address(address)
    assert unwrapped(six) == six
    assert not entry_allows(LISTED[0], f"[{address}]", 8080) and not entry_allows(LISTED[1], f"[{address}]", 80)
    for port in (8080, 80):
        assert "is 6to4, routed to" in detail(address_refusal(six, port, LISTED))


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("2002:7f00:1::", "routed to 127.0.0.1, a loopback address"),
        ("2002:a9fe:a9fe::1", "routed to 169.254.169.254, the cloud metadata service"),
        ("2002:c0a8:101::", "routed to 192.168.1.1, a private address"),
        ("2002:a83f:8110::", "routed to 168.63.129.16, a special-purpose address (a cloud's host endpoint)"),
    ],
)
def test_a_6to4_address_carrying_a_refused_ipv4_address_is_refused(address: str, why: str) -> None:
    refusal = address_refusal(ipaddress.ip_address(address), 443, ())
    assert refusal is not None and why in refusal.detail
    carried = ipaddress.IPv6Address(address).sixtofour
    assert refusal.rule.startswith("a 6to4 address routed to ") and str(carried) not in refusal.rule


def test_a_6to4_address_carrying_the_hosts_own_address_is_refused() -> None:
    own = frozenset({ipaddress.ip_address("93.184.215.14")})
    six = ipaddress.ip_address("2002:5db8:d70e::1")
    assert address_refusal(six, 443, ()) is None  # a public IPv4 address's 6to4 network is public
    refusal = address_refusal(six, 443, (), own)
    assert refusal is not None and refusal.rule == "a 6to4 address routed to the host's own address"


def test_refusals_read_as_sentences() -> None:
    assert address_refusal(ipaddress.ip_address("0.0.0.0"), 80, ()) == AddressRefusal(
        "an unspecified address", "0.0.0.0 is an unspecified address (allow it as an ip:port entry to reach it)"
    )
    assert address_refusal(ipaddress.ip_address("169.254.169.254"), 80, ()) == AddressRefusal(
        "the cloud metadata service", "169.254.169.254 is the cloud metadata service"
    )


@pytest.mark.parametrize("host", ["2a01:4f8:1:2::5%0", "[2a01:4f8:1:2::5%0]", "[2a01:4f8:1:2::5%25]", "fe80::1%eth0"])
def test_an_address_with_a_zone_is_no_host_at_all(host: str) -> None:
    # A zone made the host's own 2a01:4f8:1:2::5 unequal to itself, past the own-address check (review finding).
    assert literal_address(host) is None
    assert request_refusal(EgressMode.OPEN, (), host, 443) is not None


def test_a_resolved_address_with_a_zone_is_refused_even_if_public() -> None:
    own = frozenset({ipaddress.ip_address("2a01:4f8:1:2::5")})
    assert address_refusal(ipaddress.ip_address("2a01:4f8:1:2::5%0"), 443, (), own) is not None
    assert address_refusal(ipaddress.ip_address("2a01:4f8:1:2::5"), 443, (), own) == AddressRefusal(
        "the host's own address", "2a01:4f8:1:2::5 is the host's own address"
    )
