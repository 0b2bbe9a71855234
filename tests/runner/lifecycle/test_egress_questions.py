"""SUBAGENT_EGRESS=ask's questions on a real store: "Allow in this chat" keeps the host in its canonical form, and
the chat's list only spares a later run the question, never the door's refusal of loopback, private, metadata
or the host's own addresses."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from container.channel import RunChannel
from container.protocol import EGRESS_SOCKET_FILE
from core.egress_rules import parse_entry
from core.questions import Questions
from core.settings import Settings
from core.store.db import Database
from core.store.questions import QuestionKind, QuestionStatus, QuestionStore
from core.store.runs import RunStore
from runner.egress.records import HostDecision
from runner.egress.refusal import Refused
from runner.egress.resolve import checked_addresses
from runner.lifecycle.egress_questions import MAX_CHAT_ENTRIES, EgressQuestions
from runner.lifecycle.run_doors import RunDoors
from tests.fakes.memory_runtime import MemoryContainer
from tests.harness import make_settings
from tests.runner.egress.door_rig import FakeResolver
from tests.runner.lifecycle_helpers import CHAT_ID as RIG_CHAT_ID
from tests.runner.lifecycle_helpers import rig, socket_of

pytestmark = pytest.mark.timeout(60)

CHAT_ID = -100
ADMIN = 42
OWN = ipaddress.ip_address("2a01:4f8:c17:1234::1")  # the host's own address
NEIGHBOUR = "2a01:4f8:c17:1234::"  # public, not the host's: asked about, and allowed in the chat


def settings(tmp_path: Path, **values: Any) -> Settings:
    return make_settings(tmp_path / "data", SUBAGENT_EGRESS="ask", SUBAGENT_ASK_TIMEOUT_SECONDS=5, **values)


async def answer_when_asked(desk: Questions, run_id: str, option: int, count: int = 1) -> None:
    """An admin taps `option` on each of the run's first `count` questions as it appears."""
    answered: set[str] = set()
    async with asyncio.timeout(10):
        while len(answered) < count:
            for question in await desk.store.for_run(run_id, QuestionKind.EGRESS):
                if question.id not in answered:
                    await desk.answer(question.id, question.options[option], option, ADMIN, "Ada")
                    answered.add(question.id)
            await asyncio.sleep(0.01)


async def test_an_ipv6_host_allowed_in_the_chat_opens_that_host_only(db: Database, tmp_path: Path) -> None:
    desk = Questions(QuestionStore(db))
    config = settings(tmp_path)
    asking = EgressQuestions(config, desk, RunStore(db))

    decided, _ = await asyncio.gather(
        asking.ask("run-a", CHAT_ID, NEIGHBOUR, 1), answer_when_asked(desk, "run-a", option=1)
    )

    assert decided is HostDecision.ALLOW_IN_CHAT
    [kept] = await desk.store.chat_allowlist(CHAT_ID)
    assert kept.entry == "[2a01:4f8:c17:1234::]:1"  # brackets: not read back as `...::0:1`, the host's own
    entry = parse_entry(kept.entry)
    assert (entry.address, entry.ports) == (ipaddress.ip_address(NEIGHBOUR), (1,))
    # A later run of the chat: the host's own address stays refused, on the web's ports and on port 1.
    rules = await RunDoors(config, None, desk, RunStore(db)).rules(CHAT_ID)  # type: ignore[arg-type]
    assert rules is not None
    for port in (80, 443, 1):
        with pytest.raises(Refused, match="the host's own address"):
            await checked_addresses(rules, str(OWN), port, resolver=FakeResolver({}), own=frozenset({OWN}))


@pytest.mark.parametrize(
    ("entry", "host", "port", "rule"),
    [
        ("127.0.0.1:8080", "127.0.0.1", 8080, "a loopback address"),
        ("10.0.0.1:8080", "10.0.0.1", 8080, "a private address"),
        ("169.254.169.254", "169.254.169.254", 80, "the cloud metadata service"),
        ("[2a01:4f8:c17:1234::1]:8443", str(OWN), 8443, "the host's own address"),
        ("intranet.test", "intranet.test", 443, "a private address"),
    ],
)
async def test_the_chats_list_never_opens_what_the_door_refuses(
    db: Database, tmp_path: Path, entry: str, host: str, port: int, rule: str
) -> None:
    store = QuestionStore(db)
    # However it got there (an older version's entry, a bug): the list is no way past the address check.
    await store.allow_in_chat(CHAT_ID, entry, ADMIN, "Ada", limit=MAX_CHAT_ENTRIES)
    rules = await RunDoors(settings(tmp_path), None, Questions(store), RunStore(db)).rules(CHAT_ID)  # type: ignore[arg-type]
    assert rules is not None
    resolver = FakeResolver({"intranet.test": ["10.1.2.3"]})
    with pytest.raises(Refused, match=rule):
        await checked_addresses(rules, host, port, resolver=resolver, own=frozenset({OWN}))


async def test_the_operators_list_still_opens_a_listed_private_address(db: Database, tmp_path: Path) -> None:
    # SUBAGENT_EGRESS_ALLOW is the operator's word: its ip:port entries reach a private service, as before.
    config = settings(tmp_path, SUBAGENT_EGRESS_ALLOW="127.0.0.1:8080")
    rules = await RunDoors(config, None, Questions(QuestionStore(db)), RunStore(db)).rules(CHAT_ID)  # type: ignore[arg-type]
    assert rules is not None
    found = await checked_addresses(rules, "127.0.0.1", 8080, resolver=FakeResolver({}), own=frozenset())
    assert [str(a) for a in found] == ["127.0.0.1"]


async def test_concurrent_connections_share_one_question_and_the_bound_holds(db: Database, tmp_path: Path) -> None:
    desk = Questions(QuestionStore(db))
    asking = EgressQuestions(settings(tmp_path, SUBAGENT_MAX_QUESTIONS=2), desk, RunStore(db))

    # Ten connections to one new host, then ten to ten new hosts, all at once.
    same = [asking.ask("run-same", CHAT_ID, "pypi.org", 443) for _ in range(10)]
    decided = await asyncio.gather(*same, answer_when_asked(desk, "run-same", option=0))
    assert decided[:10] == [HostDecision.ALLOW_ONCE] * 10
    assert len(await desk.store.for_run("run-same")) == 1

    many = [asking.ask("run-many", CHAT_ID, f"h{i}.example.com", 443) for i in range(10)]
    decided = await asyncio.gather(*many, answer_when_asked(desk, "run-many", option=2, count=2))
    assert len(await desk.store.for_run("run-many")) == 2  # SUBAGENT_MAX_QUESTIONS, however many came at once
    assert decided[:10] == [HostDecision.DENY] * 10


async def test_a_full_chat_list_is_asked_without_allow_in_this_chat(db: Database, tmp_path: Path) -> None:
    desk = Questions(QuestionStore(db))
    for i in range(MAX_CHAT_ENTRIES):
        assert await desk.store.allow_in_chat(CHAT_ID, f"h{i}.example.com", ADMIN, "Ada", limit=MAX_CHAT_ENTRIES)
    assert not await desk.store.allow_in_chat(CHAT_ID, "one.more.example", ADMIN, "Ada", limit=MAX_CHAT_ENTRIES)
    asking = EgressQuestions(settings(tmp_path), desk, RunStore(db))

    decided, _ = await asyncio.gather(
        asking.ask("run-a", CHAT_ID, "pypi.org", 443), answer_when_asked(desk, "run-a", option=0)
    )

    [question] = await desk.store.for_run("run-a")
    assert question.options == ("Allow once", "Deny") and "/web remove" in question.text
    assert decided is HostDecision.ALLOW_ONCE
    assert len(await desk.store.chat_allowlist(CHAT_ID)) == MAX_CHAT_ENTRIES


async def wants_a_new_host(channel: RunChannel, container: MemoryContainer) -> int | None:
    """Connects through its door to a public address on no list, and waits for the chat."""
    await channel.task()
    _, writer = await asyncio.open_unix_connection(str(socket_of(container).parent / EGRESS_SOCKET_FILE))
    writer.write(b"CONNECT 93.184.216.34:443 HTTP/1.1\r\n\r\n")
    await asyncio.Event().wait()
    return None


async def test_a_runs_open_host_question_ends_with_the_run(tmp_path: Path) -> None:
    async with rig(tmp_path, wants_a_new_host, SUBAGENT_EGRESS="ask") as r:
        run_id = await r.spawn("fetch it")
        desk = r.service.questions
        async with asyncio.timeout(10):
            while True:  # the store has no change events
                asked = await desk.store.for_run(run_id, QuestionKind.EGRESS)
                if asked:
                    break
                await asyncio.sleep(0.01)
        assert asked[0].is_open

        await r.service.manager.cancel_run(RIG_CHAT_ID, run_id)
        await r.settled()

        [question] = await desk.store.for_run(run_id, QuestionKind.EGRESS)
        assert (question.status, question.detail) == (QuestionStatus.ENDED, "its run ended")
