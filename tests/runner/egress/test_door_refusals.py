"""What the door refuses, each over its real socket with a real server listening where the request points:
without its guard, each of these would reach the server. Every refusal is a short answer and an event."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.egress_rules import EgressMode
from tests.runner.egress.door_rig import (
    LOOPBACK,
    Events,
    FakeResolver,
    ask,
    body,
    echo_server,
    forwarder,
    open_door,
    read_to_end,
    rules,
    status,
    tunnel,
    web_server,
    within,
)

# Each target with what the refusal says in open mode, where only the address check stands in the way
# (`{port}`: the echo server's, listening on 127.0.0.1): what the client reads (the rule, and its own words),
# then what the event keeps for the operator. localhost goes through the host's real resolver.
LOOPBACK_TARGETS = [
    ("127.0.0.1:{port}", "127.0.0.1 is a loopback address", "127.0.0.1 is a loopback address"),
    ("localhost:{port}", "localhost resolves to a loopback address", "localhost resolves to "),  # 127.0.0.1, ::1
    ("[::1]:{port}", "::1 is a loopback address", "::1 is a loopback address"),
    ("0.0.0.0:{port}", "0.0.0.0 is an unspecified address", "0.0.0.0 is an unspecified address"),
    ("[::ffff:127.0.0.1]:{port}", "::ffff:127.0.0.1 is a loopback address", "127.0.0.1 is a loopback address"),
    ("2130706433:{port}", "is not a host name or an IP address", "is not a host name or an IP address"),
    ("0177.0.0.1:{port}", "is not a host name or an IP address", "is not a host name or an IP address"),
    ("10.0.0.1:80", "10.0.0.1 is a private address", "10.0.0.1 is a private address"),
    ("169.254.169.254:80", "is the cloud metadata service", "169.254.169.254 is the cloud metadata service"),
    ("[fd00:ec2::254]:80", "is the cloud metadata service", "fd00:ec2::254 is the cloud metadata service"),
    ("[fec0::1]:80", "fec0::1 is a special-purpose address", "(deprecated site-local)"),
    ("168.63.129.16:80", "168.63.129.16 is a special-purpose address", "(a cloud's host endpoint)"),
]


async def refused_connect(path: Path, target: str) -> tuple[int, bytes]:
    answer = await ask(path, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return status(answer), body(answer)


@pytest.mark.parametrize(("target", "told", "kept"), LOOPBACK_TARGETS)
async def test_open_mode_refuses_loopback_private_and_metadata_addresses(
    tmp_path: Path, target: str, told: str, kept: str
) -> None:
    events = Events()
    async with echo_server() as echo, open_door(tmp_path / "egress.sock", rules(EgressMode.OPEN), events):
        code, text = await refused_connect(tmp_path / "egress.sock", target.format(port=echo.port))
        event = await events.next()
    assert code == 403 and told in text.decode()
    assert not event.allowed and kept in event.reason and event.address is None
    assert echo.accepted == 0


@pytest.mark.parametrize("target", [target for target, _, _ in LOOPBACK_TARGETS])
async def test_an_allowlist_refuses_what_it_does_not_list_as_asked(tmp_path: Path, target: str) -> None:
    events = Events()
    async with echo_server() as echo:
        # Listed: a name, and 127.0.0.1 on another port. None of the targets is either.
        door_rules = rules(allow=[f"allowed.test:{echo.port}", f"{LOOPBACK}:1"])
        async with open_door(tmp_path / "egress.sock", door_rules, events):
            code, _ = await refused_connect(tmp_path / "egress.sock", target.format(port=echo.port))
            event = await events.next()
    assert code == 403
    assert "not in SUBAGENT_EGRESS_ALLOW" in event.reason or "not a host name" in event.reason
    assert echo.accepted == 0


async def test_localhost_is_refused_when_only_its_address_is_listed(tmp_path: Path) -> None:
    events = Events()
    async with (
        echo_server() as echo,
        open_door(tmp_path / "egress.sock", rules(allow=[f"{LOOPBACK}:{echo.port}"]), events),
    ):
        code, text = await refused_connect(tmp_path / "egress.sock", f"localhost:{echo.port}")
        async with tunnel(tmp_path / "egress.sock", f"{LOOPBACK}:{echo.port}"):
            pass  # the address itself, as listed, goes through
    assert code == 403 and b"not in SUBAGENT_EGRESS_ALLOW" in text
    assert echo.accepted == 1


async def test_an_allowed_host_on_a_port_not_allowed_is_refused(tmp_path: Path) -> None:
    events = Events()
    async with echo_server() as echo:
        resolver = FakeResolver({"allowed.test": [LOOPBACK]})
        door_rules = rules(allow=["allowed.test", f"{LOOPBACK}:{echo.port}"])  # the name: ports 80 and 443 only
        async with open_door(tmp_path / "egress.sock", door_rules, events, resolver=resolver):
            code, _ = await refused_connect(tmp_path / "egress.sock", f"allowed.test:{echo.port}")
            event = await events.next()
    assert code == 403 and f"allowed.test:{echo.port} is not in SUBAGENT_EGRESS_ALLOW" in event.reason
    assert resolver.calls == [] and echo.accepted == 0


async def test_a_listed_name_resolving_to_a_private_address_is_refused(tmp_path: Path) -> None:
    events = Events()
    async with echo_server() as echo:
        resolver = FakeResolver({"intranet.test": [LOOPBACK]})  # 127.0.0.1 is not listed as ip:port
        door_rules = rules(allow=[f"intranet.test:{echo.port}"])
        async with open_door(tmp_path / "egress.sock", door_rules, events, resolver=resolver):
            code, text = await refused_connect(tmp_path / "egress.sock", f"intranet.test:{echo.port}")
            event = await events.next()
    assert code == 403 and text == b"intranet.test resolves to a loopback address\n"
    assert event.reason.startswith("intranet.test resolves to 127.0.0.1: 127.0.0.1 is a loopback address")
    assert event.host == "intranet.test" and event.address is None and echo.accepted == 0


async def test_a_name_whose_answer_changes_after_the_check_is_not_looked_up_again(tmp_path: Path) -> None:
    events = Events()
    async with echo_server() as echo:
        resolver = FakeResolver({"rebind.test": ["10.0.0.1"]})
        door_rules = rules(allow=[f"rebind.test:{echo.port}", f"{LOOPBACK}:{echo.port}"])
        async with open_door(tmp_path / "egress.sock", door_rules, events, resolver=resolver):
            code, _ = await refused_connect(tmp_path / "egress.sock", f"rebind.test:{echo.port}")
            resolver.table["rebind.test"] = [LOOPBACK]  # what a second lookup would now say
            await events.next()
    assert code == 403 and resolver.calls == ["rebind.test"] and echo.accepted == 0


async def test_userinfo_in_the_uri_is_refused(tmp_path: Path) -> None:
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[authority]), events):
            answer = await ask(
                tmp_path / "egress.sock",
                f"GET http://allowed.test@{authority}/hello HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(),
            )
            event = await events.next()
    assert status(answer) == 403 and "userinfo" in event.reason and server.requests == []


async def test_a_host_header_other_than_the_uri_is_refused(tmp_path: Path) -> None:
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[authority]), events):
            answer = await ask(
                tmp_path / "egress.sock",
                f"GET http://{authority}/hello HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode(),
            )
            event = await events.next()
    assert status(answer) == 400 and "Host header" in event.reason and server.requests == []


async def test_two_content_lengths_are_refused_and_the_answer_survives_the_unread_body(tmp_path: Path) -> None:
    """Through the forwarder, over TCP: the door reads the body it will not carry, or closing would reset
    the connection and the client would never see why."""
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with (
            open_door(tmp_path / "egress.sock", rules(allow=[authority]), events),
            forwarder(tmp_path / "egress.sock") as port,
        ):
            reader, writer = await asyncio.open_connection(LOOPBACK, port)
            try:
                writer.write(
                    f"POST http://{authority}/echo HTTP/1.1\r\nHost: {authority}\r\n"
                    "Content-Length: 100000\r\nContent-Length: 5\r\n\r\n".encode()
                    + b"b" * 100_000
                )
                answer = await within(read_to_end(reader))
            finally:
                writer.close()
            event = await events.next()
    assert status(answer) == 400 and b"two Content-Length headers" in body(answer)
    assert "two Content-Length" in event.reason and server.requests == []


@pytest.mark.parametrize(
    "request_head",
    [
        "GET / HTTP/1.1\r\nHost: {authority}\r\n\r\n",
        "GET https://{authority}/ HTTP/1.1\r\nHost: {authority}\r\n\r\n",
        "POST http://{authority}/echo HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 1\r\n"
        "Transfer-Encoding: chunked\r\n\r\n",
    ],
)
async def test_origin_form_https_uris_and_mixed_framing_are_malformed(tmp_path: Path, request_head: str) -> None:
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[authority]), events):
            answer = await ask(tmp_path / "egress.sock", request_head.format(authority=authority).encode())
            event = await events.next()
    assert status(answer) == 400 and not event.allowed and server.requests == []


async def test_raw_bytes_get_a_400_or_nothing_and_the_door_keeps_serving(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    async with echo_server() as echo, open_door(path, rules(allow=[f"{LOOPBACK}:{echo.port}"]), events):
        # A TLS hello straight at the proxy, binary noise with a blank line, and a head cut short.
        hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256))
        assert await ask(path, hello, close_after=True) == b""
        assert status(await ask(path, bytes(range(1, 256)) + b"\r\n\r\n")) == 400
        _, cut_short = await asyncio.open_unix_connection(str(path))
        cut_short.write(b"CONNECT 127.0.0")
        cut_short.close()
        for _ in range(3):
            assert not (await events.next()).allowed
        async with tunnel(path, f"{LOOPBACK}:{echo.port}") as (reader, writer):
            writer.write(b"still here")
            assert await within(reader.readexactly(10)) == b"still here"
    assert events.seen[0].reason.startswith("the client closed before its request head ended")


async def test_a_head_over_16_kb_is_refused(tmp_path: Path) -> None:
    events = Events()
    async with open_door(tmp_path / "egress.sock", rules(EgressMode.OPEN), events):
        answer = await ask(
            tmp_path / "egress.sock", b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: " + b"y" * 20_000
        )
        event = await events.next()
    assert status(answer) == 400 and "16 KB" in event.reason
