"""The workspace's tar stream (container/workspace_tar.py): a tree packs and unpacks to the same tree, links kept
as links; a hostile archive never writes outside the workspace, through a link, or a device."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from container.channel_files import LocalFileFailed
from container.workspace_pack import pack
from container.workspace_stream import StreamBody
from container.workspace_tar import Skips, empty, unpack


def packed(root: Path) -> tuple[bytes, Skips]:
    skips = Skips()
    return b"".join(pack(root, skips)), skips


def unpacked(data: bytes, root: Path) -> tuple[int, Skips]:
    skips = Skips()
    return unpack(StreamBody(io.BytesIO(data), len(data)), root, skips), skips


def tree(root: Path) -> dict[str, tuple[str, object]]:
    """Every entry below `root`: its kind and its content, link target or mode."""
    found: dict[str, tuple[str, object]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            found[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            found[rel] = ("dir", None)
        elif not stat.S_ISREG(st.st_mode):
            found[rel] = ("special", None)
        else:
            found[rel] = ("file", (path.read_bytes(), st.st_mode & 0o111 != 0, int(st.st_mtime)))
    return found


def test_a_workspace_round_trips_with_its_links_kept_as_links(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "a" / "b" / "c").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "a" / "b" / "c" / "deep.txt").write_text("deep")
    (source / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    (source / ("n" * 150)).write_text("a name longer than ustar's 100 bytes")
    (source / os.fsdecode(b"caf\xff")).write_text("not UTF-8")
    (source / "rel").symlink_to("a/b")
    (source / "python").symlink_to("/usr/bin/python3")  # a venv's link out: kept, never followed
    (source / "dangling").symlink_to("nowhere")
    os.mkfifo(source / "pipe")
    target.mkdir()

    data, skips = packed(source)
    assert len(data) % tarfile.RECORDSIZE == 0
    assert skips.count == 1 and "pipe" in skips.describe()
    placed, refused = unpacked(data, target)

    expected = tree(source)
    del expected["pipe"]
    assert tree(target) == expected
    assert refused.count == 0 and placed == len(expected)
    assert (target / "rel" / "c" / "deep.txt").read_text() == "deep"  # the relative link works as it did


def test_an_empty_workspace_packs_to_an_archive_of_nothing(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    (tmp_path / "target").mkdir()
    data, _ = packed(tmp_path / "source")
    assert unpacked(data, tmp_path / "target")[0] == 0
    assert list((tmp_path / "target").iterdir()) == []


def hostile_archive(outside: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(
            name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", linkname: str = "", mode: int = 0o644
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.size = kind, linkname, mode, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        add(str(outside / "absolute"), data=b"x")
        add("../dotdot", data=b"x")
        add("a/../../dotdot2", data=b"x")
        add("out", tarfile.SYMTYPE, linkname=str(outside))
        add("out/through-link", data=b"x")  # would land in `outside` if the link were followed
        add("victim", tarfile.SYMTYPE, linkname=str(outside / "victim.txt"))
        add("victim", data=b"replaces the link, not its target")
        add("loop", tarfile.SYMTYPE, linkname=".")
        add("loop/loop/x", data=b"x")
        add("hard-out", tarfile.LNKTYPE, linkname="../victim.txt")
        add("hard-through", tarfile.LNKTYPE, linkname="out/victim.txt")
        add("hard-in", tarfile.LNKTYPE, linkname="victim")
        add("char", tarfile.CHRTYPE)
        add("block", tarfile.BLKTYPE)
        add("fifo", tarfile.FIFOTYPE)
        add("suid", data=b"#!/bin/sh\n", mode=0o6777)
        add("d", tarfile.DIRTYPE)
        add("d", data=b"a file where a folder is")
        add("ok/fine.txt", data=b"fine")
    return buffer.getvalue()


def test_a_hostile_archive_writes_nothing_outside_the_workspace(tmp_path: Path) -> None:
    outside, workspace = tmp_path / "outside", tmp_path / "workspace"
    outside.mkdir()
    workspace.mkdir()
    (outside / "victim.txt").write_text("untouched")
    before = tree(tmp_path)

    _, skips = unpacked(hostile_archive(outside), workspace)

    assert tree(outside) == {"victim.txt": before["outside/victim.txt"]}
    assert not (tmp_path / "dotdot").exists() and not (tmp_path / "dotdot2").exists()
    got = tree(workspace)
    assert got["out"] == ("link", str(outside))  # the link is kept; nothing was written through it
    assert got["victim"][0] == "file" and (workspace / "victim").read_bytes() == b"replaces the link, not its target"
    assert (workspace / "hard-in").samefile(workspace / "victim")
    assert got["ok/fine.txt"][0] == "file" and got["d"] == ("dir", None)
    assert stat.S_IMODE((workspace / "suid").stat().st_mode) == 0o755
    for absent in ("char", "block", "fifo", "hard-out", "hard-through", "loop/loop/x", "a"):
        assert absent not in got
    assert skips.count == 11, skips.describe()


def test_a_download_cut_short_raises_connection_error(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "f").write_bytes(os.urandom(100_000))
    (tmp_path / "target").mkdir()
    data, _ = packed(tmp_path / "source")
    with pytest.raises(ConnectionError, match="ended"):
        unpack(StreamBody(io.BytesIO(data[:50_000]), len(data)), tmp_path / "target", Skips())


def test_bytes_that_are_no_tar_are_refused(tmp_path: Path) -> None:
    junk = os.urandom(4096)
    with pytest.raises(tarfile.TarError):
        unpack(StreamBody(io.BytesIO(junk), len(junk)), tmp_path, Skips())


def test_what_follows_the_archive_is_read_to_the_declared_end(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    (tmp_path / "target").mkdir()
    data, _ = packed(tmp_path / "source")
    source = io.BytesIO(data + b"trailing")
    unpack(StreamBody(source, len(data) + 8), tmp_path / "target", Skips())
    assert source.tell() == len(data) + 8


def test_a_workspace_that_cannot_be_written_fails_locally(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "f").write_text("x")
    data, _ = packed(tmp_path / "source")
    with pytest.raises(LocalFileFailed):
        unpacked(data, tmp_path / "missing")


def test_empty_removes_links_without_following_them(tmp_path: Path) -> None:
    outside, workspace = tmp_path / "outside", tmp_path / "workspace"
    (outside / "keep").mkdir(parents=True)
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "link").symlink_to(outside)
    (workspace / "link").symlink_to(outside)
    (workspace / "file").write_text("x")
    empty(workspace)
    assert list(workspace.iterdir()) == [] and (outside / "keep").is_dir()
