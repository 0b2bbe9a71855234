"""`/subagents <run id>` as serve.py wires it: the run's files in and out come with its state and output."""

from __future__ import annotations

from pathlib import Path

from bot.commands import RunOutputSource
from core.store.chat_files import FileKind
from core.store.outbox import SentFileKind
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.serve import subagent_factory
from tests.bot.helpers import RecordingChannel, make_delivery
from tests.fakes.memory_runtime import MemoryRuntime
from tests.harness import make_settings
from tests.run_files_helpers import give, send

CHAT_ID = -3101


async def test_subagents_with_an_id_lists_the_runs_files(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    stores = await Stores.open(settings)
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)
    try:
        await stores.chats.ensure(CHAT_ID, "group", "main")
        await RunStore(stores.db).create(
            "run-f", chat_id=CHAT_ID, turn_id=None, task="plot it", label="plot", include_context=False,
            status=RunStatus.QUEUED,
        )  # fmt: skip
        await give(stores.db, "run-f", CHAT_ID, [("sales.csv", 412 * 1024, FileKind.DOCUMENT)])
        await send(stores.db, "run-f", CHAT_ID, "chart.png", 34 * 1024, SentFileKind.PHOTO, tmp_path / "out" / "1")
        async with MemoryRuntime() as runtime:
            subagents = subagent_factory(settings, stores, runtime)(make_delivery(stores.db, channel), typing)
            control = subagents.control
            assert isinstance(control, RunOutputSource)

            text = await control.run_output(CHAT_ID, "run-f")
    finally:
        await typing.close()
        await stores.db.close()

    assert text is not None
    assert text.splitlines()[1:] == [
        "Files in: sales.csv (412 KB)",
        "Files out: chart.png (34 KB, photo)",
        "No output to show: it has no container yet.",
    ]
