"""Files for real: a group posts a CSV and gets a chart back. Fake Telegram at the edge, real PTB, real
SQLite, the real engine and image; the subagent's container fetches the files over its run channel, writes
them to its inbox itself, plots with the image's python3 and sends the PNG back with send_file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.store.messages import MessageStore
from core.store.run_files import Direction, RunFileStore
from core.store.runs import RunStore
from runner.channel.photo_kind import PhotoFormat, photo_of
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, until_no_containers

pytestmark = pytest.mark.docker

SALES = b"month,total\njan,3\nfeb,5\nmar,4\napr,7\n"
PLOT_SCRIPT = (Path(__file__).parent / "plot_png.py").read_bytes()


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_a_csv_posted_in_the_group_comes_back_as_a_chart(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    settings = make_settings(tmp_path, tg)
    async with telegram_app(settings, with_subagents=True) as app:
        script = tg.push_media_message(GROUP_ID, "document", PLOT_SCRIPT, file_name="plot.py")
        # The trigger carries the CSV and replies to the script: the offline main model passes both files.
        asked = tg.push_media_message(
            GROUP_ID,
            "document",
            SALES,
            file_name="../../sales.csv",
            caption=f"@{tg.bot_username} background: $ python3 inbox/plot.py inbox/sales.csv chart.png"
            " ;; send_file chart.png monthly totals",
            reply_to_message_id=script["message"]["message_id"],
        )["message"]["message_id"]

        (chart,) = await tg.wait_for_files(GROUP_ID, 1, timeout_seconds=RUN_WAIT_SECONDS)

        def result_message() -> Any:
            return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

        result = await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)
        (record,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        files = await RunFileStore(app.stores.db).of_run(record.id)
        stored = [m for m in await MessageStore(app.stores.db).recent(GROUP_ID, 20) if m.is_bot]
        await until_no_containers(GROUP_ID)

    # The chart: a real PNG, sent as a photo, as a reply to the message that asked, with its caption.
    photo = photo_of(chart.data[:65536], len(chart.data))
    assert photo is not None and photo.format is PhotoFormat.PNG and (photo.width, photo.height) == (320, 200)
    assert (chart.method, chart.file_name, chart.caption) == ("sendPhoto", "chart.png", "monthly totals")
    assert chart.reply_to_message_id == asked
    # The run was given both files, the CSV under its safe name, and ran the script on it.
    assert record.status == "completed" and set(record.files) == {"f1", "f2"}
    assert sorted((f.direction, f.name) for f in files) == [
        (Direction.IN, "plot.py"),
        (Direction.IN, "sales.csv"),
        (Direction.OUT, "chart.png"),
    ]
    assert "4 bars -> chart.png" in result.plain_text
    # What the main agent sees next: the file it sent, and the result naming only that file.
    assert any(m.content.startswith("[file sent: chart.png") for m in stored)
    assert "Files sent: chart.png" in result.plain_text
    # Kept host-side, never in the chat's workspace (the container wrote its own copy there).
    out = next(f for f in files if f.direction is Direction.OUT)
    assert out.stored is not None and Path(out.stored).is_relative_to(settings.data_dir / "files" / "out")
    assert await asyncio.to_thread(Path(out.stored).read_bytes) == chart.data
