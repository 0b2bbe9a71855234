"""The files counters as the service wires them: a run's chat files are counted (files and bytes in) when it
starts, not again when it is re-attached after a restart; a file it sends is counted (files and bytes out)
once accepted, not when refused. Real SQLite, real run channels, the in-memory engine."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from container.protocol import FileMeta, SpawnRequest
from core.store.chat_files import ChatFile, ChatFileStore, FileKind, NewFile
from core.store.messages import MessageStore, NewMessage
from core.store.run_files import Direction, RunFileStore
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.channel.channel_answers import ChannelRefused
from runner.channel.run_endpoint import RunInbox
from runner.channel.run_file_desk import ReceivedFile
from runner.ipc.batch import RequestOutcome
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, LABEL_INSTANCE, LABEL_RUN_ID
from runner.storage.chat_file_cache import ChatFileCache
from runner.storage.paths import DataPaths
from tests.fakes.memory_runtime import MemoryRuntime
from tests.runner.lifecycle_helpers import CHAT_ID, Rig, forever, rig

pytestmark = pytest.mark.timeout(60)

SALES = b"region,total\n" * 100


async def posted(stores: Stores, data_dir: Path, name: str, data: bytes) -> ChatFile:
    """A file posted in the chat, its copy already downloaded (the rig's service has no channel to download from)."""
    unique = secrets.token_hex(6)
    message_id = await MessageStore(stores.db).add(
        NewMessage(
            chat_id=CHAT_ID,
            sender_name="Alice",
            content=name,
            kind="document",
            file=NewFile(FileKind.DOCUMENT, f"id-{unique}", unique, name, "text/csv", len(data)),
        )
    )
    assert message_id is not None
    chat_file = await ChatFileStore(stores.db).of_message(message_id)
    assert chat_file is not None
    await asyncio.to_thread(write, ChatFileCache(DataPaths(data_dir).files_in_dir, None).path_for(chat_file), data)
    return chat_file


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def counted(r: Rig, direction: Direction) -> tuple[float | None, float | None]:
    registry = r.service.metrics.registry
    labels = {"direction": direction.value}
    return (
        registry.get_sample_value("crewbot_subagent_files_total", labels),
        registry.get_sample_value("crewbot_subagent_file_bytes_total", labels),
    )


async def upload(inbox: RunInbox, upload_id: str, data: bytes) -> str:
    """What the channel does with a file the run sends: a host-chosen target, its bytes, then the desk's answer."""
    meta = FileMeta(upload_id=upload_id, name="chart.png")
    target = await inbox.begin_upload(meta)
    if target is None:
        return "already sent"
    await asyncio.to_thread(target.write_bytes, data)
    return await inbox.file_received(meta, ReceivedFile(target, len(data), None))


async def test_files_given_and_sent_are_counted_once(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started), SUBAGENT_MAX_FILES=1) as r:
        assert counted(r, Direction.IN) == (0, 0) and counted(r, Direction.OUT) == (0, 0)
        sales = await posted(r.stores, tmp_path / "data", "sales.csv", SALES)
        run_id = secrets.token_hex(6)
        request = SpawnRequest(request_id=run_id, task="plot it", files=[sales.ref])
        assert await r.service.manager.on_request(CHAT_ID, request) is RequestOutcome.ACCEPTED
        async with asyncio.timeout(10):
            await started.wait()

        assert counted(r, Direction.IN) == (1, len(SALES))

        live = r.service.live.get(run_id)
        assert live is not None and isinstance(live.inbox, RunInbox)
        assert await upload(live.inbox, "upload-1", b"\x89PNG" * 10) == "sent"
        assert await upload(live.inbox, "upload-1", b"\x89PNG" * 10) == "already sent"  # a retry
        with pytest.raises(ChannelRefused):
            await upload(live.inbox, "upload-2", b"more")  # over SUBAGENT_MAX_FILES=1

        assert counted(r, Direction.OUT) == (1, 40)
        assert counted(r, Direction.IN) == (1, len(SALES))


async def test_a_run_reattached_after_a_restart_is_not_counted_again(tmp_path: Path) -> None:
    run_id = "old-run-files"

    async def left_running(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        sales = await posted(stores, tmp_path / "data", "sales.csv", SALES)
        runs = RunStore(stores.db)
        await runs.create(
            run_id, chat_id=CHAT_ID, turn_id=None, task="plot it", label="plot", include_context=False,
            status=RunStatus.QUEUED, files=[sales.ref],
        )  # fmt: skip
        await runs.mark_running(run_id, None)
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(CHAT_ID)}
        await runs.set_container(run_id, runtime.add_existing(labels))

    async with rig(tmp_path, forever(), prepare=left_running) as r:
        await r.until((r.service.paths.channel_dir(run_id) / "run.sock").exists)  # re-attached: its channel is open

        given = [f for f in await RunFileStore(r.stores.db).of_run(run_id) if f.direction is Direction.IN]
        assert [(f.name, f.size_bytes) for f in given] == [("sales.csv", len(SALES))]  # offered its files again
        assert counted(r, Direction.IN) == (0, 0)  # the process that started it counted them
