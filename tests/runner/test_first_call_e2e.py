"""A run's first LLM call sent by the host as its container starts, for real: the real image, engine and
offline model. The container's own first request must be answered with that call (the host learned the
very request the container sends, /workspace and all), and with SUBAGENT_EARLY_FIRST_CALL off nothing of it
happens."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("allow_model_requests")]


RUN_WAIT_SECONDS = 90.0


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def run_one(tmp_path: Path, tg: FakeTelegram, **settings: Any) -> list[MutableMapping[str, Any]]:
    """One subagent run from a chat message to its result in the chat; the log events of the app."""
    with structlog.testing.capture_logs() as logs:
        async with telegram_app(make_settings(tmp_path, tg, **settings), with_subagents=True):
            tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ echo early bird")
            result = await tg.wait_until(
                lambda: next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None),
                timeout_seconds=RUN_WAIT_SECONDS,
            )
            assert "early bird" in result.plain_text
    return logs


async def test_the_containers_first_request_is_answered_by_the_hosts_early_call(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    logs = await run_one(tmp_path, tg)

    sent = [e for e in logs if e["event"] == "first_call_sent"]
    handed_over = [e for e in logs if e["event"] == "llm_call" and e.get("first_call")]
    assert [e["status"] for e in sent] == [200]
    assert len(handed_over) == 1 and handed_over[0]["run_id"] == sent[0]["run_id"]
    closed = [e for e in logs if e["event"] == "llm_socket_closed"]
    assert [e["first_call_handed_over"] for e in closed] == [True]


async def test_with_the_setting_off_the_container_makes_every_call(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    logs = await run_one(tmp_path, tg, SUBAGENT_EARLY_FIRST_CALL=False)

    assert not [e for e in logs if e["event"].startswith("first_call") or e.get("first_call")]
    assert [e["first_call_handed_over"] for e in logs if e["event"] == "llm_socket_closed"] == [None]
