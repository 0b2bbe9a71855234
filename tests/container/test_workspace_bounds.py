"""What unpack holds and how much it takes (container/workspace_tar.py, container/workspace_stream.py): a member's
headers are refused past MAX_MEMBER_HEADER_BYTES before tarfile reads them, the number of members is bounded both
ways, and hostile header values are the archive's fault (refused, or the entry skipped), never a crash."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Literal

import pytest

from container import workspace_pack, workspace_tar
from container.channel_files import LocalFileFailed
from container.workspace_pack import pack
from container.workspace_stream import MAX_MEMBER_HEADER_BYTES, ArchiveRefused, StreamBody
from container.workspace_tar import MAX_NAME_BYTES, Skips, unpack
from tests.container.test_workspace_tar import packed, tree, unpacked

HUGE_NAME_BYTES = 64 * 1024 * 1024
# Unpacking the 64 MB name cost about 190 MiB of peak memory before the bound; now next to nothing.
MAX_PEAK_GROWTH_KIB = 16 * 1024


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, pax: dict[str, str] | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.pax_headers = kind, len(data), pax or {}
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % 512)


def archive(*members: bytes) -> bytes:
    return b"".join(members) + bytes(1024)


class CountingReader(io.BytesIO):
    """The download, counting what unpack took of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1, /) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def huge_name_archive(fmt: Literal[0, 1, 2]) -> bytes:
    info = tarfile.TarInfo("n" * HUGE_NAME_BYTES)
    info.size = 5
    return info.tobuf(fmt, "utf-8", "surrogateescape") + b"hello" + bytes(507 + 1024)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu-longname"])
def test_a_huge_member_name_is_refused_before_it_is_read(tmp_path: Path, fmt: Literal[0, 1, 2]) -> None:
    data = huge_name_archive(fmt)
    source = CountingReader(data)
    with pytest.raises(ArchiveRefused, match="headers are over"):
        unpack(StreamBody(source, len(data)), tmp_path, Skips())
    assert source.taken < 1024 * 1024  # the 64 MB header was never read, let alone held
    assert list(tmp_path.iterdir()) == []


MEASURE = """
import resource, sys
from pathlib import Path
from container.workspace_stream import StreamBody
from container.workspace_tar import Skips, unpack
path, target = Path(sys.argv[1]), Path(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open(path, "rb", buffering=0) as source:
    try:
        unpack(StreamBody(source, path.stat().st_size), target, Skips())
    except Exception as exc:
        print(type(exc).__name__)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_huge_member_name_costs_the_process_no_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.tar"
    path.write_bytes(huge_name_archive(tarfile.PAX_FORMAT))
    (tmp_path / "target").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), str(tmp_path / "target")],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    refusal, growth_kib = done.stdout.split()
    assert refusal == "ArchiveRefused"
    assert int(growth_kib) < MAX_PEAK_GROWTH_KIB


def test_a_chain_of_headers_is_bounded_in_all(tmp_path: Path) -> None:
    # Each GNU long name is small, but tarfile holds every one of a member's headers until the member is read.
    link = tarfile.TarInfo("x" * 1000)
    link.size = 0
    one = link.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    long_name = one[: -tarfile.BLOCKSIZE]  # the ././@LongLink header and its data, without the member itself
    data = archive(long_name * (MAX_MEMBER_HEADER_BYTES // len(long_name) + 2) + one)
    with pytest.raises(ArchiveRefused, match="headers are over"):
        unpacked(data, tmp_path)


def test_the_longest_names_pack_writes_still_unpack(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    deep = source.joinpath(*["d" * 250] * 15)  # a path of 3,765 bytes
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("deep")
    (deep / "link").symlink_to("t" * 4000)
    target.mkdir()
    data, _ = packed(source)
    placed, skips = unpacked(data, target)
    assert skips.count == 0 and tree(target) == tree(source) and placed == 17


def test_names_the_file_system_refuses_are_skipped_not_fatal(tmp_path: Path) -> None:
    data = archive(
        member("n" * 300, b"a name over NAME_MAX"),
        member("d" * 300 + "/f", b"a folder over NAME_MAX"),
        member("long/" * (MAX_NAME_BYTES // 5 + 1), b"over PATH_MAX"),
        member("link", kind=tarfile.SYMTYPE, pax={"linkpath": "t" * 5000}),
        member("nan-time", b"kept", pax={"mtime": "nan"}),
        member("far-time", b"kept", pax={"mtime": "1e300"}),
        member("ok.txt", b"fine"),
    )
    placed, skips = unpacked(data, tmp_path)
    assert placed == 3 and skips.count == 4, skips.describe()
    assert sorted(os.listdir(tmp_path)) == ["far-time", "nan-time", "ok.txt"]


def test_a_global_header_is_refused(tmp_path: Path) -> None:
    # Each would add its keys to every later member's: many of them, a member's memory times the members.
    data = archive(tarfile.TarInfo.create_pax_global_header({"comment": "x" * 1000}), member("a.txt", b"a"))
    with pytest.raises(ArchiveRefused, match="global"):
        unpacked(data, tmp_path)


def test_a_sparse_map_that_never_ends_is_bounded(tmp_path: Path) -> None:
    sparse = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s", "GNU.sparse.realsize": "9"}
    # tarfile reads a GNU 1.0 sparse map until it has as many numbers as its first line says.
    data = archive(member("s", b"999999999\n" + b"1\n" * 100_000, pax=sparse))
    with pytest.raises(ArchiveRefused, match="headers are over"):
        unpacked(data, tmp_path)


def test_hostile_numbers_are_the_archives_fault(tmp_path: Path) -> None:
    for value in ("99999999999999999999999", "-5"):
        data = archive(member("a", b"", pax={"size": value}), member("b", b"b"))
        with pytest.raises(tarfile.TarError):
            unpacked(data, tmp_path)


def test_members_past_the_bound_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_tar, "MAX_MEMBERS", 5)
    fits, over = tmp_path / "fits", tmp_path / "over"
    fits.mkdir()
    over.mkdir()
    assert unpacked(archive(*(member(f"f{n}", b"x") for n in range(5))), fits)[0] == 5
    with pytest.raises(ArchiveRefused, match="more than 5"):
        unpacked(archive(*(member(f"f{n}", b"x") for n in range(6))), over)


def test_pack_sends_no_more_members_than_unpack_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_pack, "MAX_MEMBERS", 5)  # the name pack takes from workspace_tar
    for n in range(6):
        (tmp_path / f"f{n}").write_text("x")
    with pytest.raises(LocalFileFailed, match="over 5 entries"):
        b"".join(pack(tmp_path, Skips()))
