"""Where subagents may connect: the egress mode, the operator's allowlist entries, and the address check.

A request is matched by what the client asked for: a name only by a name pattern (`pypi.org`,
`*.wikipedia.org`, `api.github.com:443`), a literal address only by an address entry (`127.0.0.1:8080`,
`[::1]:8080`), so `localhost:8080` is refused when only `127.0.0.1:8080` is allowed. An entry without a
port allows ports 80 and 443. Whatever a name resolves to must then be a public address, unless that
address and port are listed as an address entry: loopback, private, link-local (the cloud metadata
address among them), multicast, reserved and the host's own addresses are refused otherwise.

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


class EgressMode(StrEnum):
    NONE = "none"  # no network at all (the default): the door does not listen
    ALLOWLIST = "allowlist"  # only what SUBAGENT_EGRESS_ALLOW names
    OPEN = "open"  # any public address


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
    """Why a request for `host:port` is refused before anything is resolved; None: it may go on."""
    if mode is EgressMode.NONE:
        return "subagents have no network here (SUBAGENT_EGRESS=none)"
    if not 0 < port <= MAX_PORT:
        return f"{port} is not a port"
    if literal_address(host) is None and not valid_name(host.lower()):
        return f"{host[:80]!r} is not a host name or an IP address"
    if mode is EgressMode.ALLOWLIST and not any(entry_allows(entry, host, port) for entry in allow):
        return f"{host[:80]}:{port} is not in SUBAGENT_EGRESS_ALLOW"
    return None


def address_refusal(
    address: IpAddress, port: int, allow: tuple[AllowEntry, ...], own: frozenset[IpAddress] = frozenset()
) -> str | None:
    """Why connecting to this resolved address is refused; None: it is public, or listed with its port."""
    if getattr(address, "scope_id", None) is not None:
        return f"{address} has a zone: a standard address is needed"
    plain = unwrapped(address)
    listed = any(
        entry.address is not None and unwrapped(entry.address) == plain and port in entry.ports for entry in allow
    )
    if listed:
        return None
    what = _what(plain, own)
    if what is not None:
        phrase, hint = what
        return f"{plain} is {phrase}{ALLOW_HINT if hint else ''}"
    if isinstance(plain, ipaddress.IPv6Address) and plain.sixtofour is not None:
        # 6to4 is routed to the IPv4 address it carries: 2002:7f00:1:: is loopback wherever 6to4 works.
        carried = _what(plain.sixtofour, own)
        if carried is not None:
            return f"{plain} is 6to4, routed to {plain.sixtofour}, {carried[0]}"
    return None


def _what(plain: IpAddress, own: frozenset[IpAddress]) -> tuple[str, bool] | None:
    """What kind of address refused this is, and whether listing it as ip:port would allow it; None: public."""
    if plain in METADATA_ADDRESSES:
        return "a cloud metadata address", False
    if plain in own:
        return "this host's own address", False
    kind = _private_kind(plain)
    if kind is None:
        return None
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} address", True


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
