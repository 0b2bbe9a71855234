"""Scheduled tasks that name chat files: kept with the task, listed, handed to each run; bad names refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.schedules.book import MAX_TASK_FILES, TaskRequestError
from core.store.schedules import TaskMode
from tests.bot.schedules.rig import CHAT, CREATOR, open_rig


async def test_a_task_naming_files_hands_them_to_each_run_and_lists_them(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3")
    try:
        task = await rig.book.schedule(CHAT, CREATOR, "$ wc -l inbox/*", "every 2s", files=["f3", " f7", "f3"])
        spawned = await rig.spawner.wait_for(1)
        listed = await rig.book.list_text(CHAT)
        stored = await rig.store.get(task.id)
    finally:
        await rig.stop()
    assert task.files == ("f3", "f7")  # trimmed, each once
    assert stored is not None and stored.files == ("f3", "f7")  # kept in the database, not only in memory
    assert spawned[0].files == ("f3", "f7")
    assert "files: f3, f7" in listed


@pytest.mark.parametrize(
    ("files", "mode", "expected"),
    [
        (["3"], TaskMode.SUBAGENT, "is not a file id like f3"),
        (["f0"], TaskMode.SUBAGENT, "is not a file id like f3"),
        (["../f3"], TaskMode.SUBAGENT, "is not a file id like f3"),
        ([f"f{n}" for n in range(1, MAX_TASK_FILES + 2)], TaskMode.SUBAGENT, f"at most {MAX_TASK_FILES} files"),
        (["f3"], TaskMode.MESSAGE, "subagent tasks only"),
    ],
)
async def test_bad_file_names_are_refused_with_the_reason(
    tmp_path: Path, files: list[str], mode: TaskMode, expected: str
) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3")
    try:
        with pytest.raises(TaskRequestError, match=expected):
            await rig.book.schedule(CHAT, CREATOR, "$ date", "every 1h", mode=mode, files=files)
        assert await rig.book.list_text(CHAT) == await rig.book.list_text(CHAT + 1)  # nothing was scheduled
    finally:
        await rig.stop()
