"""SUBAGENT_EGRESS=ask at the door: a connection to an unlisted public host is held while the chat decides, asked
once per host and port in a run, and released (to the address checked before asking) or refused by the answer;
what the door refuses anyway is refused without asking. A test name resolves to 127.0.0.1 listed as an ip:port
entry, which stands for a public address here: no test reaches the internet."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import pytest

from core.egress_rules import EgressMode, IpAddress
from runner.egress.records import HostDecision
from tests.runner.egress.door_rig import (
    HEAD_END,
    LOOPBACK,
    Events,
    FakeResolver,
    ask,
    echo_server,
    open_door,
    read_to_end,
    rules,
    status,
    within,
)

PUBLIC_ADDRESS = "93.184.216.34"  # never connected to: refused before (no tap) or after (no decision) a question


class Chat:
    """The chat's decisions as a test makes them: each question waits until the test answers it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.answer: asyncio.Future[HostDecision] | None = None
        self.question = asyncio.Event()

    async def __call__(self, host: str, port: int) -> HostDecision:
        self.asked.append((host, port))
        self.answer = asyncio.get_running_loop().create_future()
        self.question.set()
        return await self.answer

    def decide(self, decision: HostDecision) -> None:
        assert self.answer is not None
        self.answer.set_result(decision)


async def connect_head(path: Path, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return reader, writer


async def test_a_held_connection_goes_through_once_the_chat_allows_it(tmp_path: Path) -> None:
    events, chat = Events(), Chat()
    async with echo_server() as echo:
        resolver = FakeResolver({"pypi.test": [LOOPBACK]})
        door_rules = rules(EgressMode.ASK, allow=[f"{LOOPBACK}:{echo.port}"])
        path = tmp_path / "egress.sock"
        async with open_door(path, door_rules, events, resolver=resolver, asker=chat):
            reader, writer = await connect_head(path, f"pypi.test:{echo.port}")
            await within(chat.question.wait())
            assert chat.asked == [("pypi.test", echo.port)]
            waiting = asyncio.ensure_future(reader.readuntil(HEAD_END))
            await asyncio.sleep(0.2)
            assert not waiting.done() and echo.accepted == 0  # held: nothing connected while the chat decides
            chat.decide(HostDecision.ALLOW_ONCE)
            assert await within(waiting) == b"HTTP/1.1 200 Connection established\r\n\r\n"
            writer.write(b"hello")
            writer.write_eof()
            assert await within(read_to_end(reader)) == b"hello"
            writer.close()
            # Asked once: a second connection to the same host and port in this run goes through unasked.
            again = await ask(path, f"CONNECT pypi.test:{echo.port} HTTP/1.1\r\n\r\n".encode(), close_after=True)
            assert status(again) == 200 and chat.asked == [("pypi.test", echo.port)]
    assert resolver.calls == ["pypi.test", "pypi.test"]  # each connection's own lookup, never a second one


async def test_deny_or_no_answer_refuses_and_concurrent_connections_share_one_question(tmp_path: Path) -> None:
    events, chat = Events(), Chat()
    async with echo_server() as echo:
        resolver = FakeResolver({"pypi.test": [LOOPBACK]})
        door_rules = rules(EgressMode.ASK, allow=[f"{LOOPBACK}:{echo.port}"])
        path = tmp_path / "egress.sock"
        async with open_door(path, door_rules, events, resolver=resolver, asker=chat):
            raw = f"CONNECT pypi.test:{echo.port} HTTP/1.1\r\n\r\n".encode()
            answers = [asyncio.ensure_future(ask(path, raw, close_after=True)) for _ in range(3)]
            await within(chat.question.wait())
            await asyncio.sleep(0.1)
            chat.decide(HostDecision.DENY)
            assert [status(answer) for answer in await within(asyncio.gather(*answers))] == [403] * 3
    assert chat.asked == [("pypi.test", echo.port)]
    assert echo.accepted == 0
    reasons = [event.reason for event in await events.wait_for(3)]
    assert all("not allowed by the chat" in reason for reason in reasons)


async def test_a_host_on_the_chats_list_goes_through_unasked(tmp_path: Path) -> None:
    events, chat = Events(), Chat()
    async with echo_server() as echo:
        resolver = FakeResolver({"pypi.test": [LOOPBACK]})
        door_rules = rules(EgressMode.ASK, allow=[f"{LOOPBACK}:{echo.port}"], chat_allow=[f"pypi.test:{echo.port}"])
        path = tmp_path / "egress.sock"
        async with open_door(path, door_rules, events, resolver=resolver, asker=chat):
            answer = await ask(path, f"CONNECT pypi.test:{echo.port} HTTP/1.1\r\n\r\n".encode(), close_after=True)
    assert status(answer) == 200 and chat.asked == []


@pytest.mark.parametrize(
    ("target", "answer"),
    [
        ("169.254.169.254:80", None),  # the metadata service, as a literal
        ("10.0.0.1:443", None),
        ("[::1]:443", None),
        ("localhost:443", ["127.0.0.1"]),
        ("metadata.test:80", ["169.254.169.254"]),
        ("intranet.test:443", ["10.0.0.1"]),
        ("own.test:443", ["198.51.100.7"]),  # documentation range here stands for the host's own address
        ("self.test:443", [PUBLIC_ADDRESS]),  # the host's own public address
    ],
)
@pytest.mark.parametrize("in_chats_list", [False, True])
async def test_what_the_door_refuses_anyway_is_refused_without_asking(
    tmp_path: Path, target: str, answer: list[str] | None, in_chats_list: bool
) -> None:
    # The chat's own list ("Allow in this chat") naming the target changes nothing: it spares questions only.
    events, chat = Events(), Chat()
    host = target.rsplit(":", 1)[0]
    resolver = FakeResolver({} if answer is None else {host: answer})
    own: frozenset[IpAddress] = frozenset({ipaddress.ip_address(PUBLIC_ADDRESS)})
    path = tmp_path / "egress.sock"
    door_rules = rules(EgressMode.ASK, chat_allow=[target] if in_chats_list else [])
    async with open_door(path, door_rules, events, resolver=resolver, asker=chat, own_addresses=own):
        refused = await ask(path, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode(), close_after=True)
    assert status(refused) == 403
    assert chat.asked == []


async def test_the_door_connects_only_to_the_address_it_checked_before_asking(tmp_path: Path) -> None:
    """A name that resolves public when asked about and private afterwards: the door never looks it up again."""
    events, chat = Events(), Chat()

    class Rebinding(FakeResolver):
        async def __call__(self, host: str, port: int) -> list[IpAddress]:
            answer = await super().__call__(host, port)
            self.table[host] = ["10.0.0.1"]  # what a hostile name server says next time
            return answer

    async with echo_server() as echo:
        resolver = Rebinding({"rebind.test": [LOOPBACK]})
        door_rules = rules(EgressMode.ASK, allow=[f"{LOOPBACK}:{echo.port}"])
        path = tmp_path / "egress.sock"
        async with open_door(path, door_rules, events, resolver=resolver, asker=chat):
            answer = asyncio.ensure_future(
                ask(path, f"CONNECT rebind.test:{echo.port} HTTP/1.1\r\n\r\n".encode(), close_after=True)
            )
            await within(chat.question.wait())
            chat.decide(HostDecision.ALLOW_IN_CHAT)
            assert status(await within(answer)) == 200
        event = await events.next()
    assert resolver.calls == ["rebind.test"]
    assert (event.allowed, event.address) == (True, LOOPBACK)
    assert echo.accepted == 1
