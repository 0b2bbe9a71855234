"""Where subagents may connect: the egress mode, the operator's allowlist entries, and the address check.

A request is matched by what the client asked for: a name only by a name pattern (`pypi.org`,
`*.wikipedia.org`, `api.github.com:443`), a literal address only by an address entry (`127.0.0.1:8080`,
`[::1]:8080`), so `localhost:8080` is refused when only `127.0.0.1:8080` is allowed. An entry without a
port allows ports 80 and 443. Whatever a name resolves to must then be a public address, unless that
address and port are listed as an address entry: loopback, private, link-local (the cloud metadata
address among them), multicast, reserved, IANA's special-purpose ranges and the host's own addresses are
refused otherwise. A refusal names the rule (`a loopback address`) apart from its detail (which address):
the client is told the rule only, so the door tells it neither what a name resolves to nor the host's own
addresses.

Standard library only: the settings validate entries with it, the host's egress door applies it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS = (80, 443)  # an entry without a port: the web's
MAX_PORT = 65535
MAX_NAME_CHARS = 253
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# The cloud metadata services; link-local or private already, named so a reason can say what they are.
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
ALLOW_HINT = " (allow it as an ip:port entry to reach it)"
SPECIAL_PURPOSE = "a special-purpose address"

# IANA's IPv4 and IPv6 Special-Purpose Address Registries (2025), every block not globally reachable (False or
# N/A), whole: the few globally reachable anycast addresses inside 192.0.0.0/24 and 2001::/23 go with them
# (nothing a subagent needs). Refused whatever Python's ipaddress says, which calls some of them global and
# differs between releases (3.11.7: 192.0.0.8, 192.88.99.0/24, 3fff::/20). Left out: ::ffff:0:0/96 and
# 2002::/16, checked as the IPv4 address they carry or are routed to.
SPECIAL_PURPOSE_RANGES: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.ip_network(network), name)
    for network, name in (
        ("0.0.0.0/8", "this network"),
        ("10.0.0.0/8", "private use"),
        ("100.64.0.0/10", "shared address space"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link local"),
        ("172.16.0.0/12", "private use"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "deprecated 6to4 relay anycast"),
        ("192.168.0.0/16", "private use"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("240.0.0.0/4", "reserved"),
        ("255.255.255.255/32", "limited broadcast"),
        ("168.63.129.16/32", "a cloud's host endpoint"),  # Azure's: public space, reached from every VM
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation"),
        ("100::/64", "discard-only"),
        ("100:0:0:1::/64", "dummy IPv6 prefix"),
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing (SRv6) SIDs"),
        ("fc00::/7", "unique local"),
        ("fe80::/10", "link-local unicast"),
        ("fec0::/10", "deprecated site-local"),  # RFC 3879; not in the registry, and global to Python
    )
)


class EgressMode(StrEnum):
    NONE = "none"  # no network at all (the default): the door does not listen
    ALLOWLIST = "allowlist"  # only what SUBAGENT_EGRESS_ALLOW names
    OPEN = "open"  # any public address
    ASK = "ask"  # the allowlist, plus a question to the chat for any other public host


class EntryInvalid(ValueError):
    """An allowlist entry that is not a host pattern or an address, with an optional port."""


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One allowlist entry: a name (`*.` in front: any name under it, not itself) or an address, and ports."""

    name: str | None
    address: IpAddress | None
    wildcard: bool
    ports: tuple[int, ...]

    def __str__(self) -> str:
        ports = "" if self.ports == DEFAULT_PORTS else f":{self.ports[0]}"
        if self.address is not None:
            shown = f"[{self.address}]" if self.address.version == 6 and ports else str(self.address)
            return f"{shown}{ports}"
        return f"{'*.' if self.wildcard else ''}{self.name}{ports}"


def parse_entry(text: str) -> AllowEntry:
    raw = text.strip().lower()
    if not raw:
        raise EntryInvalid("an empty entry")
    host, ports = _split_port(raw)
    address = literal_address(host)
    if address is not None:
        return AllowEntry(name=None, address=address, wildcard=False, ports=ports)
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    if not valid_name(name):
        raise EntryInvalid(f"{text.strip()[:80]!r} is not a host name, `*.` and a host name, or an IP address")
    return AllowEntry(name=name, address=None, wildcard=wildcard, ports=ports)


def entry_for(host: str, port: int) -> AllowEntry:
    """The entry that allows exactly what a client asked for (a name or a literal address, and its port; one of
    the web's ports: both): its `str` is the canonical form, which parse_entry reads back as the same entry."""
    address = literal_address(host)
    ports = DEFAULT_PORTS if port in DEFAULT_PORTS else (port,)
    if address is not None:
        return AllowEntry(name=None, address=address, wildcard=False, ports=ports)
    return AllowEntry(name=host.lower().rstrip("."), address=None, wildcard=False, ports=ports)


def _split_port(raw: str) -> tuple[str, tuple[int, ...]]:
    if raw.startswith("["):  # [::1]:8080
        host, bracket, rest = raw[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise EntryInvalid(f"{raw[:80]!r}: an IPv6 address in brackets, then an optional :port")
        return host, _ports(rest[1:]) if rest else DEFAULT_PORTS
    if raw.count(":") == 1:
        host, _, port = raw.partition(":")
        return host, _ports(port)
    return raw, DEFAULT_PORTS  # no port, or a bare IPv6 address


def _ports(text: str) -> tuple[int, ...]:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_PORT:
        raise EntryInvalid(f"{text[:10]!r} is not a port (1 to {MAX_PORT})")
    return (int(text),)


def literal_address(host: str) -> IpAddress | None:
    """The address a host written as a literal names (`10.0.0.1`, `::1`, `[::1]`), in its standard form;
    None for a name. Only standard forms count: `2130706433` and `0177.0.0.1` are names here, which no name
    pattern matches, and which resolve (on the host, in open mode) to addresses that are checked."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    # A zone (`fe80::1%eth0`, `2a01::5%0`) is no standard form: it makes the address unequal to the same one
    # without it (the host's own addresses were missed), and getaddrinfo drops it. Refused as no host at all.
    return None if getattr(address, "scope_id", None) is not None else address


def valid_name(name: str) -> bool:
    """A DNS host name in ASCII, with a last label that is not all digits (`1.2.3.4` is no name)."""
    labels = name.rstrip(".").split(".")
    return (
        0 < len(name) <= MAX_NAME_CHARS
        and len(labels) >= 1
        and all(_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
    )


def unwrapped(address: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is the IPv4 address it carries: the same destination.
    A 6to4 address (`2002:7f00:1::`) is not: it names a network behind that IPv4 address, so it never matches
    an IPv4 entry; address_refusal checks the IPv4 address it is routed to as well."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def entry_allows(entry: AllowEntry, host: str, port: int) -> bool:
    """Whether this entry allows what the client asked for: `host` as it wrote it, and the port."""
    if port not in entry.ports:
        return False
    address = literal_address(host)
    if entry.address is not None or address is not None:
        return entry.address is not None and address is not None and unwrapped(entry.address) == unwrapped(address)
    name = host.lower().rstrip(".")
    assert entry.name is not None
    return name.endswith(f".{entry.name}") if entry.wildcard else name == entry.name


def request_refusal(mode: EgressMode, allow: tuple[AllowEntry, ...], host: str, port: int) -> str | None:
    """Why a request for `host:port` is refused before anything is resolved; None: it may go on (in ask mode an
    unlisted host goes on to its address check, and is asked about only if that passes: the door's job)."""
    if mode is EgressMode.NONE:
        return "subagents have no network here (SUBAGENT_EGRESS=none)"
    if not 0 < port <= MAX_PORT:
        return f"{port} is not a port"
    if literal_address(host) is None and not valid_name(host.lower()):
        return f"{host[:80]!r} is not a host name or an IP address"
    if mode is EgressMode.ALLOWLIST and not listed(allow, host, port):
        return f"{host[:80]}:{port} is not in SUBAGENT_EGRESS_ALLOW"
    return None


def listed(allow: tuple[AllowEntry, ...], host: str, port: int) -> bool:
    """Whether an entry allows what the client asked for (in ask mode: whether the door goes on without asking)."""
    return any(entry_allows(entry, host, port) for entry in allow)


@dataclass(frozen=True, slots=True)
class AddressRefusal:
    """Why an address is refused, twice: the rule, which the client may read, and the detail, for the operator."""

    rule: str  # `a loopback address`, `the host's own address`: never the address itself
    detail: str  # `127.0.0.1 is a loopback address (allow it ...)`: the address, what it is, what would allow it


def address_refusal(
    address: IpAddress, port: int, allow: tuple[AllowEntry, ...], own: frozenset[IpAddress] = frozenset()
) -> AddressRefusal | None:
    """Why connecting to this resolved address is refused; None: it is public, or listed with its port. `allow` is
    the operator's list only: a chat's own list (ask mode) skips a question, never this check."""
    if getattr(address, "scope_id", None) is not None:
        return AddressRefusal("an address with a zone", f"{address} has a zone: a standard address is needed")
    plain = unwrapped(address)
    listed = any(
        entry.address is not None and unwrapped(entry.address) == plain and port in entry.ports for entry in allow
    )
    if listed:
        return None
    what = _what(plain, own)
    if what is not None:
        rule, detail, hint = what
        return AddressRefusal(rule, f"{plain} is {detail}{ALLOW_HINT if hint else ''}")
    if isinstance(plain, ipaddress.IPv6Address) and plain.sixtofour is not None:
        # 6to4 is routed to the IPv4 address it carries: 2002:7f00:1:: is loopback wherever 6to4 works.
        carried = _what(plain.sixtofour, own)
        if carried is not None:
            return AddressRefusal(
                f"a 6to4 address routed to {carried[0]}", f"{plain} is 6to4, routed to {plain.sixtofour}, {carried[1]}"
            )
    return None


def _what(plain: IpAddress, own: frozenset[IpAddress]) -> tuple[str, str, bool] | None:
    """The rule that refuses this address, its detail, and whether listing it as ip:port would allow it; None:
    public. The host's own addresses come last: one that is private anyway is refused as private, so the rule
    tells a client nothing about which private addresses are the host's."""
    if plain in METADATA_ADDRESSES:
        return "the cloud metadata service", "the cloud metadata service", False
    kind = _private_kind(plain)
    if kind is not None:
        rule = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} address"
        return rule, rule, True
    special = next((name for network, name in SPECIAL_PURPOSE_RANGES if plain in network), None)
    if special is not None:
        return SPECIAL_PURPOSE, f"{SPECIAL_PURPOSE} ({special})", True
    if plain in own:
        return "the host's own address", "the host's own address", False
    return None


def _private_kind(address: IpAddress) -> str | None:
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None
