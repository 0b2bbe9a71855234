"""SUBAGENT_EGRESS=ask for real: a subagent in a real container fetches an unlisted host; its connection is held
while the chat is asked, a member's tap changes nothing, an admin's "Allow in this chat" releases it and keeps
the host in the chat's list. The test name resolves to 127.0.0.1 through the resolver seam (the door's lookups),
listed as an ip:port entry so the address check passes: it stands for a public address, and nothing leaves the
machine."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.egress_rules import IpAddress
from core.store.questions import QuestionKind, QuestionStatus, QuestionStore
from runner.egress.resolve import Resolver, SystemLookups
from tests.fakes.telegram_server import DEFAULT_USER_ID, FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_egress_e2e import PAGE, fetch, site, tg  # noqa: F401 (fixtures)
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

ADMIN = 7003
NAME = "pypi.test"


@pytest.fixture
def test_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The door's lookups answer NAME with 127.0.0.1 (and nothing else): the resolver seam."""

    def for_door(self: SystemLookups, max_in_flight: int = 2) -> Resolver:
        async def resolve(host: str, port: int) -> list[IpAddress]:
            if host != NAME:
                raise OSError(f"{host} does not resolve in this test")
            return [ipaddress.ip_address("127.0.0.1")]

        return resolve

    monkeypatch.setattr(SystemLookups, "for_door", for_door)


@pytest.fixture
async def admin_chat(tg: FakeTelegram) -> AsyncIterator[None]:  # noqa: F811
    tg.set_chat_admins(GROUP_ID, [ADMIN])
    yield


@pytest.mark.usefixtures("test_names", "admin_chat")
async def test_a_run_reaches_a_host_only_after_an_admin_allowed_it(
    tmp_path: Path,
    tg: FakeTelegram,  # noqa: F811
    site: tuple[int, int],  # noqa: F811
    subagent_image: str,
) -> None:
    allowed, _ = site
    settings = make_settings(tmp_path, tg, SUBAGENT_EGRESS="ask", SUBAGENT_EGRESS_ALLOW=f"127.0.0.1:{allowed}")
    async with telegram_app(settings, with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: {fetch(f'http://{NAME}:{allowed}/hello')}")

        def question() -> tuple[int, dict[str, str]] | None:
            found = [m for m in tg.sent_messages(GROUP_ID) if f"wants to reach {NAME}:{allowed}" in m.plain_text]
            if not found:
                return None
            return found[-1].message_id, {
                b["text"]: b["callback_data"] for b in tg.buttons(GROUP_ID, found[-1].message_id)
            }

        asked, buttons = await tg.wait_until(question, RUN_WAIT_SECONDS)
        assert list(buttons) == ["Allow once", "Allow in this chat", "Deny"]
        member = await tg.wait_for_answer(
            tg.push_callback_query(GROUP_ID, asked, buttons["Allow once"], user_id=DEFAULT_USER_ID)
        )
        assert member.show_alert and member.text == "Only a chat admin can answer this."
        store = QuestionStore(app.stores.db)
        [pending] = await store.open_of(QuestionKind.EGRESS)
        admin = await tg.wait_for_answer(
            tg.push_callback_query(GROUP_ID, asked, buttons["Allow in this chat"], user_id=ADMIN)
        )
        assert admin.text == "Answered: Allow in this chat."

        def result() -> str | None:
            return next((m.plain_text for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

        text = await tg.wait_until(result, RUN_WAIT_SECONDS)
        assert text.rstrip().endswith(f"{PAGE}\n[exit code: 0]")  # fetched, not refused
        decided = await store.get(pending.id)
        assert decided is not None and decided.status is QuestionStatus.ANSWERED and decided.answered_by == ADMIN
        assert [entry.entry for entry in await store.chat_allowlist(GROUP_ID)] == [f"{NAME}:{allowed}"]
