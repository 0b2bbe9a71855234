"""The workspace's archive is sent with its length (the host takes no chunked body): the stream is exactly the
planned length however the workspace changes between the plan and the send, every attempt alike, and it
unpacks to what was planned."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from container.workspace_pack import RECORD_BYTES, plan
from container.workspace_tar import Skips
from tests.container.test_workspace_tar import tree, unpacked


def workspace(root: Path) -> Path:
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "a.txt").write_bytes(b"a" * 1_000)
    (root / "notes" / "grows.txt").write_bytes(b"g" * 700)
    (root / "shrinks.bin").write_bytes(b"s" * 300_000)
    (root / "goes.txt").write_bytes(b"gone soon")
    (root / "becomes-a-folder").write_bytes(b"f" * 10)
    (root / "link").symlink_to("notes/a.txt")
    (root / ("n" * 150)).write_bytes(b"long name: a pax header")
    return root


def test_the_stream_is_the_planned_length_and_unpacks_to_the_plan(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    made = plan(root, Skips())

    data = b"".join(made.stream(Skips()))

    assert len(data) == made.length and made.length % RECORD_BYTES == 0
    unpacked_root = tmp_path / "out"
    unpacked_root.mkdir()
    assert unpacked(data, unpacked_root)[0] == len(made.members) == 8
    assert tree(unpacked_root) == tree(root)


def test_changes_after_the_plan_keep_the_length_and_are_named(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    made = plan(root, Skips())
    (root / "notes" / "grows.txt").write_bytes(b"G" * 5_000)  # cut to the planned 700
    (root / "shrinks.bin").write_bytes(b"t" * 10)  # padded with zeros
    (root / "goes.txt").unlink()  # zeros
    (root / "becomes-a-folder").unlink()
    (root / "becomes-a-folder").mkdir()  # zeros: not a file any more
    (root / "new.txt").write_text("not planned: not sent")

    skips = Skips()
    data = b"".join(made.stream(skips))

    assert len(data) == made.length
    assert skips.count == 3 and "changed while it was packed" in skips.describe()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        sizes = {member.name: member.size for member in tar.getmembers()}
        assert tar.extractfile("notes/grows.txt").read() == b"G" * 700  # type: ignore[union-attr]
        assert tar.extractfile("shrinks.bin").read() == b"t" * 10 + bytes(300_000 - 10)  # type: ignore[union-attr]
        assert tar.extractfile("goes.txt").read() == bytes(9)  # type: ignore[union-attr]
    assert "new.txt" not in sizes and sizes["becomes-a-folder"] == 10


def test_every_attempt_sends_the_same_length(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    made = plan(root, Skips())
    first = b"".join(made.stream(Skips()))
    shutil.rmtree(root / "notes")

    again = b"".join(made.stream(Skips()))

    assert len(first) == len(again) == made.length


def test_an_empty_workspace_is_two_zero_blocks_in_one_record(tmp_path: Path) -> None:
    made = plan(tmp_path, Skips())

    assert made.members == () and made.length == RECORD_BYTES
    assert b"".join(made.stream(Skips())) == bytes(RECORD_BYTES)
