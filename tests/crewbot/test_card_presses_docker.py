"""The status card's Cancel button with Docker: a member asks for background work, an outsider's tap leaves
its container running, the asker's tap removes it. Fake Telegram at the edge, real PTB, real SQLite, the
real engine and image (tests/crewbot/test_card_presses.py covers the rest on the in-memory runtime)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.status_card import StatusCards
from core.store.runs import RunStatus, RunStore
from tests.fakes.telegram_server import DEFAULT_USER_ID, FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, labelled_containers, until_no_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

OUTSIDER = 7002
CARD = "Subagents of this request"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture(autouse=True)
def quick_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    """The card edits at most every 0.2 s here (3 s in a group): the test waits for its edits."""
    defaults = StatusCards.__init__.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "interval_seconds", 0.2)


async def test_a_tap_on_cancel_removes_the_runs_container(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    settings = make_settings(tmp_path, tg, STATUS_CARD="true")
    async with telegram_app(settings, with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ sleep 300")  # from Alice

        def cancel_button() -> tuple[int, str] | None:
            cards = [m.message_id for m in tg.sent_messages(GROUP_ID) if m.plain_text.startswith(CARD)]
            buttons = tg.buttons(GROUP_ID, cards[-1]) if cards else []
            return (cards[-1], buttons[0]["callback_data"]) if buttons else None

        card, data = await tg.wait_until(cancel_button, RUN_WAIT_SECONDS)
        runs, run_id = RunStore(app.stores.db), data.removeprefix("c:")

        async def running() -> None:
            while True:  # the store and the engine have no change events for us
                record = await runs.get(run_id)
                containers = await asyncio.to_thread(labelled_containers, GROUP_ID)
                if record is not None and record.container_id and containers:
                    return
                await asyncio.sleep(0.2)

        await asyncio.wait_for(running(), RUN_WAIT_SECONDS)

        refused = await tg.wait_for_answer(tg.push_callback_query(GROUP_ID, card, data, user_id=OUTSIDER))
        assert refused.show_alert and refused.text is not None and refused.text.startswith("Only Alice")
        await asyncio.sleep(1.0)
        assert await asyncio.to_thread(labelled_containers, GROUP_ID)  # still there

        done = await tg.wait_for_answer(tg.push_callback_query(GROUP_ID, card, data, user_id=DEFAULT_USER_ID))
        assert done.text is not None and done.text.startswith("Cancelled") and not done.show_alert
        await until_no_containers(GROUP_ID)
        record = await runs.get(run_id)
        assert record is not None and record.status == RunStatus.CANCELLED
        await tg.wait_until(lambda: True if tg.buttons(GROUP_ID, card) == [] else None, 10.0)  # nothing to press
