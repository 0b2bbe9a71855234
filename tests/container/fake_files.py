"""The run's files as the scripted host keeps them (tests/container/scripted_llm.py): the host's `FileEndpoint`
(runner/channel/file_transfer.py) over a temp folder, so `GET /run/files/<index>` and `POST /run/files` are
served, parsed and bounded by the host's own handler, as the rest of the run API is.

- an offered file is the bytes the test gave for its index, written to the temp folder (host-only storage);
- an upload is admitted up to the task's `max_files_out`, a retried upload_id is taken once ("already sent"),
  and each accepted one is kept in `uploads` with its meta and bytes;
- `refusals` answers a path (`/run/files/0`, or `/run/files` for uploads) with a 4xx and the reason.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from container.protocol import FILES_PATH, FileMeta, TaskSpec
from runner.channel.channel_answers import ChannelRefused as HostRefusal
from runner.channel.run_file_desk import ReceivedFile


@dataclass(frozen=True, slots=True)
class ReceivedUpload:
    """One upload the fake host accepted: its meta, its bytes, and whether the host judged it a photo."""

    meta: FileMeta
    data: bytes
    photo: bool


@dataclass
class FakeFiles:
    offered: Mapping[int, bytes] = field(default_factory=dict)
    refusals: Mapping[str, tuple[int, str]] = field(default_factory=dict)  # path -> (status, reason)
    uploads: list[ReceivedUpload] = field(default_factory=list)
    upload_requests: int = 0
    task: TaskSpec | None = None
    _folder: Path | None = None

    def open(self, task: TaskSpec | None) -> None:
        self.task = task
        self._folder = Path(tempfile.mkdtemp(prefix="crewbot-fake-files-"))
        for index, data in self.offered.items():
            (self._folder / f"offered-{index}").write_bytes(data)

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    @property
    def max_file_bytes(self) -> int:
        return self._task.max_file_bytes

    def offered_file(self, index: int) -> Path:
        self._refuse_if_told(f"{FILES_PATH}/{index}")
        if index not in self.offered:
            raise HostRefusal(404, f"no offered file {index}")
        return self._folder_path / f"offered-{index}"

    def admit_upload(self) -> None:
        """Before the body is read, as the host's desk: refused if told, or past the run's count."""
        self.upload_requests += 1
        self._refuse_if_told(FILES_PATH)
        if len(self.uploads) >= self._task.max_files_out:
            raise HostRefusal(429, f"this run has sent its {self._task.max_files_out} files")

    async def begin_upload(self, meta: FileMeta) -> Path | None:
        if any(upload.meta.upload_id == meta.upload_id for upload in self.uploads):
            return None
        return self._folder_path / f"upload-{meta.upload_id}"

    async def file_received(self, meta: FileMeta, received: ReceivedFile) -> str:
        self.uploads.append(ReceivedUpload(meta, received.path.read_bytes(), received.photo is not None))
        return "sent"

    async def abandon_upload(self, target: Path) -> None:
        await asyncio.to_thread(target.unlink, missing_ok=True)

    def _refuse_if_told(self, path: str) -> None:
        refusal = self.refusals.get(path)
        if refusal is not None:
            raise HostRefusal(*refusal)

    @property
    def _task(self) -> TaskSpec:
        return self.task or TaskSpec(run_id="run-files", task="t", label="l")

    @property
    def _folder_path(self) -> Path:
        assert self._folder is not None, "the fake host is not serving"
        return self._folder
