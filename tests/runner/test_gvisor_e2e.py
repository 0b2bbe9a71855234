"""A real subagent run under gVisor (SUBAGENT_RUNTIME_CLASS=runsc): fake Telegram, real PTB, the real engine
and image. Its result reaches the chat over the run channel, a host Unix socket bind-mounted into the
sandbox (which gVisor allows only with --host-uds=open in the runtime's registration)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.store.runs import RunStore
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.gvisor_helpers import RUNSC, require_runsc
from tests.runner.test_subagents_e2e import until_no_containers

pytestmark = pytest.mark.docker

RUN_WAIT_SECONDS = 120.0  # Python's start-up under gVisor's ptrace platform on a loaded 2-core machine
GVISOR_KERNEL = "Linux version 4.4.0"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_a_subagent_under_gvisor_reaches_its_result(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    require_runsc()
    settings = make_settings(tmp_path, tg, SUBAGENT_RUNTIME_CLASS=RUNSC)
    async with telegram_app(settings, with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ echo crunched $((6 * 7)); cat /proc/version")

        def result_message() -> Any:
            return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

        result = await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)
        assert "crunched 42" in result.plain_text
        # The task's shell ran on gVisor's kernel, not the host's.
        assert GVISOR_KERNEL in result.plain_text and os.uname().release not in result.plain_text
        (record,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        assert record.status == "completed" and record.llm_requests >= 2  # its model steps went over the channel
        await until_no_containers(GROUP_ID)
