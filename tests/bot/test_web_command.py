"""`/web` on a real store: the operator's allowlist (where the host's subagents may go, private services among
it) is shown to admins only; every member sees the mode, how many entries it has and the chat's own list."""

from __future__ import annotations

from pathlib import Path

from bot.web_command import WebCommand
from core.store.db import Database
from core.store.questions import QuestionStore
from tests.harness import make_settings

OPERATORS = "10.0.0.5:5432,pypi.org"


async def yes() -> bool:
    return True


async def no() -> bool:
    return False


async def test_the_operators_list_is_shown_to_admins_only(db: Database, tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_EGRESS="ask", SUBAGENT_EGRESS_ALLOW=OPERATORS)
    store = QuestionStore(db)
    await store.allow_in_chat(-1, "docs.python.org", 42, "Ada", limit=100)
    web = WebCommand(settings, store)

    member = await web.reply(-1, [], no, no)
    admin = await web.reply(-1, [], no, yes)

    assert "10.0.0.5" not in member and "Operator's list: 2 entries (shown to admins)." in member
    assert "Operator's list: 10.0.0.5:5432, pypi.org." in admin
    for shown in (member, admin):
        assert "• docs.python.org (by Ada," in shown
