"""IANA's special-purpose ranges are refused whatever Python's ipaddress calls them (3.11.7 calls fec0::/10,
192.88.99.0/24, 3fff::/20 and parts of 192.0.0.0/24 global), and a cloud's host endpoint with them; a public
address still passes, and an ip:port entry still lets a listed one through."""

from __future__ import annotations

import ipaddress

import pytest

from core.egress_rules import SPECIAL_PURPOSE, SPECIAL_PURPOSE_RANGES, IpAddress, address_refusal, parse_entry

PUBLIC = ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:1b7a", "1.1.1.1", "2001:4860:4860::8888"]
# What the issue and the registries name that Python 3.11 calls global: refused as special-purpose.
GLOBAL_TO_PYTHON = [
    "fec0::1",
    "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "168.63.129.16",
    "192.0.0.8",
    "192.0.0.255",
    "192.88.99.1",
    "3fff::1",
    "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
]
# Named by the issue, refused one way or another (Python calls some of them reserved or private already).
NAMED = ["100.64.0.1", "64:ff9b:1::1", "5f00::1", "2001:db8::1", "198.18.0.1", "240.0.0.1", "255.255.255.255"]


def samples() -> list[IpAddress]:
    """Of every range in the table: its first, middle and last address."""
    found: list[IpAddress] = []
    for network, _ in SPECIAL_PURPOSE_RANGES:
        middle = network.network_address + network.num_addresses // 2
        found.extend(dict.fromkeys([network[0], middle, network[-1]]))
    return found


@pytest.mark.parametrize("address", samples(), ids=str)
def test_every_special_purpose_range_is_refused(address: IpAddress) -> None:
    refusal = address_refusal(address, 443, ())
    assert refusal is not None and str(address) not in refusal.rule
    if address.is_global and not address.is_reserved:  # what Python alone would have let through
        assert refusal.rule == SPECIAL_PURPOSE


@pytest.mark.parametrize("text", GLOBAL_TO_PYTHON)
def test_what_python_calls_global_is_refused_as_special_purpose(text: str) -> None:
    address = ipaddress.ip_address(text)
    refusal = address_refusal(address, 443, ())
    assert refusal is not None and refusal.rule == SPECIAL_PURPOSE
    assert refusal.detail.startswith(f"{address} is a special-purpose address (")


def test_the_cloud_host_endpoint_is_named_for_the_operator() -> None:
    refusal = address_refusal(ipaddress.ip_address("168.63.129.16"), 80, ())
    assert refusal is not None and "a cloud's host endpoint" in refusal.detail


@pytest.mark.parametrize("text", NAMED)
def test_the_ranges_the_issue_names_are_refused(text: str) -> None:
    assert address_refusal(ipaddress.ip_address(text), 443, ()) is not None


@pytest.mark.parametrize("text", PUBLIC)
def test_a_public_address_passes(text: str) -> None:
    assert address_refusal(ipaddress.ip_address(text), 443, ()) is None


@pytest.mark.parametrize(
    ("entry", "text", "port"), [("168.63.129.16:80", "168.63.129.16", 80), ("[fec0::1]:443", "fec0::1", 443)]
)
def test_an_ip_port_entry_lets_a_listed_special_address_through_on_its_port(entry: str, text: str, port: int) -> None:
    listed = (parse_entry(entry),)
    address = ipaddress.ip_address(text)
    assert address_refusal(address, port, listed) is None
    refused = address_refusal(address, port + 1, listed)
    assert refused is not None and refused.rule == SPECIAL_PURPOSE


def test_the_table_is_a_frozen_tuple_of_networks() -> None:
    assert isinstance(SPECIAL_PURPOSE_RANGES, tuple)
    assert all(
        isinstance(network, ipaddress.IPv4Network | ipaddress.IPv6Network) for network, _ in SPECIAL_PURPOSE_RANGES
    )
    networks = {str(network) for network, _ in SPECIAL_PURPOSE_RANGES}
    assert "2002::/16" not in networks and "::ffff:0:0/96" not in networks  # checked as what they carry
