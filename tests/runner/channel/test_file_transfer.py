"""Files on a run's channel, attacked: the real proxy on a Unix socket, a real RunInbox and RunFileDesk over real
SQLite stores (tests/runner/channel/file_desk_rig.py). Uploads over the limits, lying lengths, hostile names,
the count limit, two at once, retries, uploads after the run ended, and offered files by index. After each:
the answer, the run's invalid-request count, what is on disk (only the accepted files, and nowhere but the
run's folder under files/out) and in the outbox (exactly the accepted files), and where the file work ran."""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.protocol import ChannelAnswer
from core.store.outbox import SentFileKind
from core.store.run_files import Direction
from core.store.run_record import RunStatus
from runner.channel import file_transfer
from runner.channel.run_endpoint import MAX_INVALID_REQUESTS
from runner.channel.run_file_desk import FilesOut, RunFileDesk
from runner.runs.live_runs import StopReason
from tests.runner.channel.file_desk_rig import (
    BOUNDARY,
    MAX_FILE_BYTES,
    MAX_FILES,
    OFFERED,
    RUN,
    DeskRig,
    chunked_head,
    desk_rig,
    file_part,
    meta_part,
    multipart,
    part,
    png,
    upload_head,
)
from tests.runner.channel.run_api_client import Answer, chunked, exchange_raw, receive_answer

WAIT_SECONDS = 10.0  # only so a broken test fails instead of hanging
OFFERED_FILES = {Path("files/in/offered-0"), Path("files/in/offered-1")}


def detail(answer: Answer) -> str:
    return ChannelAnswer.model_validate_json(answer.body).detail


async def check_kept(rig: DeskRig, accepted: int) -> None:
    """Exactly `accepted` files out: each on disk in the run's folder, recorded, and owed once by the outbox;
    nothing else written anywhere in the test's folder (the offered files were there before)."""
    rows = await rig.out_rows()
    recorded = [f for f in await rig.files_out() if f.direction is Direction.OUT]
    kept = rig.kept_out()
    assert len(rows) == len(recorded) == len(kept) == accepted
    assert {row.file.path for row in rows if row.file} == set(kept) == {Path(str(f.stored)) for f in recorded}
    assert rig.every_file() == OFFERED_FILES | {path.relative_to(rig.data) for path in kept}


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DeskRig]:
    async with desk_rig(tmp_path, monkeypatch) as opened:
        yield opened


# --- uploads that are taken ------------------------------------------------------------------------------


async def test_an_upload_is_kept_under_a_host_chosen_name_and_owed_once(rig: DeskRig) -> None:
    answer = await rig.upload(b"a,b\n1,2\n", name="table.csv", caption="  the table  ")
    assert (answer.status, detail(answer)) == (200, "sent")
    await check_kept(rig, 1)
    [row] = await rig.out_rows()
    assert row.file is not None and row.file.name == "table.csv" and row.text == "the table"
    assert row.file.path.read_bytes() == b"a,b\n1,2\n"
    assert rig.delivery.chats and rig.invalid_count == 0


@pytest.mark.parametrize(
    ("name", "sent_as"),
    [
        ("../../etc/passwd", "passwd"),
        ("a\x00b.txt", "a_b.txt"),
        ("...", "file"),
        ("..", "file"),
        ("/", "file"),
        ("x" * 300 + ".csv", "x" * 251 + ".csv"),
    ],
    ids=["traversal", "nul", "dots", "dotdot", "slash", "300-chars"],
)
async def test_a_hostile_name_is_made_safe_and_never_a_path(rig: DeskRig, name: str, sent_as: str) -> None:
    # Guards: the host chooses where the bytes go (RunFileDesk.begin), and safe_file_name the name sent.
    answer = await rig.upload(b"data", name=name)
    assert answer.status == 200, detail(answer)
    [row] = await rig.out_rows()
    assert row.file is not None and row.file.name == sent_as
    await check_kept(rig, 1)  # nothing written at the name, anywhere


async def test_the_bytes_decide_photo_or_document(rig: DeskRig) -> None:
    # Guard: photo_of on the file's first bytes (a PNG signature on a text file is not a photo).
    fake = b"\x89PNG\r\n\x1a\n" + b"just text, not an image\n" * 10
    assert (await rig.upload(fake, upload_id="upload-fake", name="picture.png")).status == 200
    assert (await rig.upload(png(), upload_id="upload-real", name="notes.txt")).status == 200
    kinds = {row.file.name: row.file.kind for row in await rig.out_rows() if row.file}
    assert kinds == {"picture.png": SentFileKind.DOCUMENT, "notes.txt": SentFileKind.PHOTO}


async def test_the_same_upload_twice_is_sent_once_and_written_once(rig: DeskRig) -> None:
    # Guard: the desk's accepted upload ids: a retry is "already sent" before its file part is read.
    assert detail(await rig.upload(b"once", upload_id="upload-same")) == "sent"
    again = await rig.upload(b"once", upload_id="upload-same")
    assert (again.status, detail(again)) == (200, "already sent")
    assert rig.threads.creates == 1
    await check_kept(rig, 1)


async def test_more_files_than_the_limit_are_refused_but_a_retry_still_learns_it_was_sent(rig: DeskRig) -> None:
    for number in range(MAX_FILES):
        assert detail(await rig.upload(b"x", upload_id=f"upload-{number:02d}")) == "sent"
    # Guard: the desk's count, checked once the meta is read (the store's own check is in tests/core).
    over = await rig.upload(b"x", upload_id="upload-over")
    assert over.status == 429 and "SUBAGENT_MAX_FILES" in detail(over)
    assert rig.threads.creates == MAX_FILES  # refused before its file part was written
    # Fixed: the limit was checked before the meta was read, so the retry of the last file got 429 too.
    retry = await rig.upload(b"x", upload_id=f"upload-{MAX_FILES - 1:02d}")
    assert (retry.status, detail(retry)) == (200, "already sent")
    await check_kept(rig, MAX_FILES)
    assert rig.invalid_count == 0


async def test_a_re_attached_run_keeps_the_files_its_earlier_process_took(rig: DeskRig) -> None:
    # Fixed: names were numbered per process, so a restarted host's first upload hit the earlier "001-1",
    # answered 500, and its clean-up deleted that file while the outbox still owed it to the chat.
    assert detail(await rig.upload(b"before the restart", upload_id="upload-early")) == "sent"
    out = FilesOut(out_dir=rig.out_dir, store=rig.files, max_files=MAX_FILES, max_file_bytes=MAX_FILE_BYTES)
    desk = RunFileDesk(rig.live, offered=[], out=out, runs=rig.runs, delivery=rig.delivery)  # type: ignore[arg-type]
    rig.inbox._files = desk  # a new process's desk for the same run
    answer = await rig.upload(b"after it", upload_id="upload-later")
    assert (answer.status, detail(answer)) == (200, "sent")
    # The new desk never saw the first upload: the store's duplicate check answers its retry.
    retry = await rig.upload(b"before the restart", upload_id="upload-early")
    assert (retry.status, detail(retry)) == (200, "already sent")
    await check_kept(rig, 2)
    assert sorted(path.read_bytes() for path in rig.kept_out()) == [b"after it", b"before the restart"]


# --- uploads over the limits -----------------------------------------------------------------------------


async def test_a_declared_length_over_the_limit_is_refused_unread(rig: DeskRig) -> None:
    body = multipart(meta_part({"upload_id": "upload-big", "name": "a"}), file_part(b"x" * 4 * MAX_FILE_BYTES))
    answer = await rig.post(body)
    assert answer.status == 413 and answer.sent < len(body)
    await check_kept(rig, 0)


async def test_an_upload_without_a_length_is_refused_unread(rig: DeskRig) -> None:
    # Guard: the Content-Length requirement (a chunked body would be read to learn its size).
    body = multipart(meta_part({"upload_id": "upload-big", "name": "a"}), file_part(b"x" * 4 * MAX_FILE_BYTES))
    answer = await exchange_raw(rig.socket, chunked_head(), chunked(body, 64 * 1024))
    assert answer.status == 411 and answer.sent < len(body)
    await check_kept(rig, 0)


async def test_a_file_part_over_the_limit_within_the_declared_length_is_refused_and_removed(rig: DeskRig) -> None:
    # Guard: _write counts the part as it streams (the declared length leaves room for the meta part).
    answer = await rig.upload(b"x" * (MAX_FILE_BYTES + 1))
    assert answer.status == 413 and "SUBAGENT_MAX_FILE_MB" in detail(answer)
    assert rig.invalid_count == 1
    await check_kept(rig, 0)


async def test_an_empty_file_is_refused_and_removed(rig: DeskRig) -> None:
    answer = await rig.upload(b"")
    assert answer.status == 422
    await check_kept(rig, 0)


async def test_a_length_shorter_than_the_body_keeps_nothing(rig: DeskRig) -> None:
    body = multipart(meta_part({"upload_id": "upload-01", "name": "a"}), file_part(b"x" * 1000))
    answer = await rig.post(body, length=len(body) // 2)
    assert answer.status == 400
    await check_kept(rig, 0)


async def test_a_body_ending_short_of_its_length_keeps_nothing_and_frees_the_desk(rig: DeskRig) -> None:
    # Guards: receive_file's clean-up (abandon_upload) when the body ends mid-file, short of its declared
    # length, and its freeing of the one-at-a-time slot. The host answers nothing on a connection that ended.
    body = multipart(meta_part({"upload_id": "upload-01", "name": "a"}), file_part(b"x" * 200_000))
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX) as conn:
        conn.setblocking(False)
        await loop.sock_connect(conn, str(rig.socket))
        await loop.sock_sendall(conn, upload_head(body, None, None) + body[:-1000])
        assert await asyncio.to_thread(rig.threads.created.wait, WAIT_SECONDS)
        conn.shutdown(socket.SHUT_WR)
        with pytest.raises(AssertionError, match="ended before a whole answer"):
            await receive_answer(conn)
    assert await asyncio.to_thread(rig.threads.removed.wait, WAIT_SECONDS)
    assert rig.kept_out() == []
    assert detail(await rig.upload(b"next", upload_id="upload-02")) == "sent"
    await check_kept(rig, 1)


# --- malformed uploads: each refused as invalid, counted, nothing kept -----------------------------------

META = meta_part({"upload_id": "upload-01", "name": "a.txt"})
FILE = file_part(b"hello")
INNER = b'--inner\r\nContent-Disposition: form-data; name="x"\r\n\r\nhi\r\n--inner--\r\n'
NESTED = part(['Content-Disposition: form-data; name="file"', "Content-Type: multipart/mixed; boundary=inner"], INNER)
START = f"--{BOUNDARY}\r\n".encode()
MALFORMED: dict[str, tuple[bytes, str | None, str]] = {
    # id: (body, Content-Type (None: multipart with the boundary), what the refusal says). The guard of each:
    "extra-meta-field": (  # FileMeta forbids extra fields
        multipart(meta_part({"upload_id": "upload-01", "name": "a", "path": "/etc"}), FILE),
        None,
        "Extra inputs",
    ),
    "meta-wrong-types": (multipart(meta_part({"upload_id": 7, "name": ["a"]}), FILE), None, "valid string"),
    "meta-not-json": (multipart(meta_part(b"{not json"), FILE), None, "meta"),  # bounded_json.validate
    "meta-too-many-values": (multipart(meta_part(b"[" + b"1," * 40 + b"1]"), FILE), None, "JSON values"),
    "meta-over-16kb": (  # _meta's running count
        multipart(meta_part(b'{"upload_id": "upload-01", "name": "' + b"a" * 17_000 + b'"}'), FILE),
        None,
        "16384",
    ),
    "file-before-meta": (multipart(FILE, META), None, "must be `meta`"),  # _part checks each part's name
    "no-meta": (multipart(FILE), None, "must be `meta`"),
    "no-file": (multipart(META), None, "must be `file`"),
    "nested-multipart": (multipart(META, NESTED), None, "must be `file`"),
    # Fixed: these two were taken (the third part ignored; the cut-off body's last CRLF kept as file bytes).
    "third-part": (multipart(META, FILE, file_part(b"more", "more")), None, "nothing may follow"),
    "no-closing-boundary": (multipart(META, FILE, closed=False), None, "not a valid file upload"),
    "garbage": (b"garbage " * 500, None, "no preamble"),
    "endless-preamble": (b"x\r\n" * 60_000, None, "no preamble"),
    "no-boundary": (multipart(META, FILE), "multipart/form-data", "boundary"),
    "not-multipart": (multipart(META, FILE), "application/json", "multipart"),
    # Fixed: aiohttp's own refusals of part headers escaped as 500s, not counted against the run.
    "too-many-part-headers": (START + b"X-A: b\r\n" * 200 + b"\r\n{}", None, "over 24 lines"),
    "part-header-too-long": (START + b"X-A: " + b"b" * 20_000 + b"\r\n\r\n{}", None, "a line over 2048 bytes"),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_upload_is_refused_counted_and_leaves_nothing(
    rig: DeskRig, case: tuple[bytes, str | None, str]
) -> None:
    body, content_type, reason = case
    answer = await rig.post(body, content_type=content_type)
    assert answer.status == 400 and reason in detail(answer), detail(answer)
    assert rig.invalid_count == 1
    await check_kept(rig, 0)
    assert detail(await rig.upload(b"after", upload_id="upload-02")) == "sent"  # the desk is free again


# --- one at a time, and only while the run is live ------------------------------------------------------


async def test_a_second_upload_while_one_is_streaming_is_refused_409(rig: DeskRig) -> None:
    # Guard: RunFileDesk.admit's one-upload-at-a-time flag, checked before the second body is read.
    body = multipart(meta_part({"upload_id": "upload-first", "name": "first"}), file_part(b"1" * 200_000))
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX) as conn:
        conn.setblocking(False)
        await loop.sock_connect(conn, str(rig.socket))
        await loop.sock_sendall(conn, upload_head(body, None, None) + body[:-1000])
        assert await asyncio.to_thread(rig.threads.created.wait, WAIT_SECONDS)  # the first is being written
        second = await rig.upload(b"2", upload_id="upload-second")
        assert second.status == 409 and "one file at a time" in detail(second)
        await loop.sock_sendall(conn, body[-1000:])
        status, _, answer = await asyncio.wait_for(receive_answer(conn), WAIT_SECONDS)
    assert (status, ChannelAnswer.model_validate_json(answer).detail) == (200, "sent")
    assert rig.invalid_count == 0
    await check_kept(rig, 1)


async def test_an_upload_after_the_run_was_cancelled_is_refused(rig: DeskRig) -> None:
    rig.live.cancelled = True
    answer = await rig.upload(b"late")
    assert answer.status == 403
    assert (await rig.get("/run/files/0")).status == 403
    await check_kept(rig, 0)


async def test_a_run_being_stopped_sends_no_more_files(rig: DeskRig) -> None:
    # Guard: RunInbox.begin_upload refuses once a stop is asked for (its result is still taken).
    rig.live.request_stop(StopReason.INVALID_REQUESTS)
    answer = await rig.upload(b"one more")
    assert answer.status == 403 and b"being stopped" in answer.body
    await check_kept(rig, 0)


async def test_a_disk_that_fails_mid_upload_is_an_answer_not_a_crash(
    rig: DeskRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Guard: receive_file's OSError answer (507, not counted as the run's fault; nothing kept).
    def full_disk(handle: object, rest: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_transfer, "_finish", full_disk)
    answer = await rig.upload(b"x" * 1000)
    assert answer.status == 507 and b"could not keep the file" in answer.body
    assert str(rig.data).encode() not in answer.body  # no host path in what the container reads
    assert rig.invalid_count == 0
    await check_kept(rig, 0)
    monkeypatch.undo()
    assert (await rig.upload(b"x" * 1000, upload_id="upload-02")).status == 200  # the desk is free again


async def test_an_upload_that_ends_after_the_run_finished_is_not_kept(rig: DeskRig) -> None:
    # Guard: RunFileStore.add_out's live check in the transaction, and the desk's removal of refused bytes.
    body = multipart(meta_part({"upload_id": "upload-01", "name": "a"}), file_part(b"x" * 200_000))
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX) as conn:
        conn.setblocking(False)
        await loop.sock_connect(conn, str(rig.socket))
        await loop.sock_sendall(conn, upload_head(body, None, None) + body[:-1000])
        assert await asyncio.to_thread(rig.threads.created.wait, WAIT_SECONDS)
        assert await rig.runs.finish(RUN, RunStatus.COMPLETED, result="done")
        await loop.sock_sendall(conn, body[-1000:])
        status, _, answer = await asyncio.wait_for(receive_answer(conn), WAIT_SECONDS)
    assert status == 403 and "cancelled or finished" in ChannelAnswer.model_validate_json(answer).detail
    await check_kept(rig, 0)


# --- offered files, by index -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "index", ["-1", "2", "99", "../x", "%2e%2e", "%2e%2e%2fx", "99999999999999999999", "", "0x1", "%D9%A1", "%C2%B9"]
)
async def test_only_an_offered_index_is_served(rig: DeskRig, index: str) -> None:
    # Guards: serve_offered's index check and RunFileDesk.offered_file's range check.
    answer = await rig.get(f"/run/files/{index}")
    assert answer.status == 404
    assert rig.invalid_count == 0


async def test_an_offered_file_is_served_by_its_index(rig: DeskRig) -> None:
    for index, content in enumerate(OFFERED):
        answer = await rig.get(f"/run/files/{index}")
        assert (answer.status, answer.body) == (200, content)


# --- where the work runs --------------------------------------------------------------------------------


async def test_file_work_runs_off_the_event_loop(rig: DeskRig) -> None:
    # Guard: every create, write, flush and removal of an upload goes through asyncio.to_thread. The test
    # records where they ran rather than timing the loop (see test_model_step_review.py).
    assert (await rig.upload(b"k" * 200_000, upload_id="upload-kept")).status == 200
    assert (await rig.upload(b"", upload_id="upload-gone")).status == 422  # written, then removed
    assert rig.threads.ids, "no file work was recorded"
    assert threading.get_ident() not in rig.threads.ids, "file work ran on the event loop"


async def test_three_invalid_uploads_stop_the_run(rig: DeskRig) -> None:
    # Guard: receive_file counts each invalid upload (RunInbox.invalid stops the run at MAX_INVALID_REQUESTS).
    for sent in range(MAX_INVALID_REQUESTS):
        assert rig.live.stop_reason is None
        assert (await rig.post(b"not multipart at all")).status == 400
        assert rig.invalid_count == sent + 1
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS
    await check_kept(rig, 0)
