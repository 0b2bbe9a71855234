"""`/subagents <run id>` as serve.py wires it: the run's connections through the egress door come with its
state and output."""

from __future__ import annotations

from pathlib import Path

from bot.commands import RunOutputSource
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.serve import subagent_factory
from tests.bot.helpers import RecordingChannel, make_delivery
from tests.egress_helpers import allowed, record, refused
from tests.fakes.memory_runtime import MemoryRuntime
from tests.harness import make_settings

CHAT_ID = -3102


async def test_subagents_with_an_id_lists_the_runs_web_connections(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    stores = await Stores.open(settings)
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)
    try:
        await stores.chats.ensure(CHAT_ID, "group", "main")
        await RunStore(stores.db).create(
            "run-w", chat_id=CHAT_ID, turn_id=None, task="fetch it", label="fetch", include_context=False,
            status=RunStatus.QUEUED,
        )  # fmt: skip
        reason = "evil.example:443 is not in SUBAGENT_EGRESS_ALLOW"
        await record(
            stores.db,
            "run-w",
            [
                allowed("run-w", CHAT_ID, "pypi.org", 443, "151.101.0.223", down=1_200_000, up=3 * 1024),
                refused("run-w", CHAT_ID, "evil.example", 443, reason),
            ],
        )
        async with MemoryRuntime() as runtime:
            subagents = subagent_factory(settings, stores, runtime)(make_delivery(stores.db, channel), typing)
            control = subagents.control
            assert isinstance(control, RunOutputSource)

            text = await control.run_output(CHAT_ID, "run-w")
    finally:
        await typing.close()
        await stores.db.close()

    assert text is not None
    assert text.splitlines()[1:] == [
        "Web: 2 connections (1 refused), 1.1 MB down, 3 KB up",
        "pypi.org:443 → 151.101.0.223, 1.1 MB down, 3 KB up",
        f"evil.example:443 refused: {reason}",
        "No output to show: it has no container yet.",
    ]
