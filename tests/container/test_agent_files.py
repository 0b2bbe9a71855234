"""The whole container agent with files, against a scripted host on its run channel: the offered files are in
the inbox before the first step and the task text lists them as written; a file that was not given is a line
there; send_file carries a file to the host; a refusal is a failed tool call and the run goes on."""

from __future__ import annotations

import json

import pytest

from container.__main__ import EXIT_COMPLETED, run_main
from container.paths import ContainerPaths
from container.protocol import FILES_PATH, OfferedFile
from tests.container.agent_helpers import PROMPT, scripted_host, tool_messages, user_texts
from tests.container.scripted_llm import TextReply, ToolCallReply

SALES = b"month,total\n" + b"2026-01,100\n" * 35_000  # about 412 KB


def offered(*files: tuple[str, bytes, str | None]) -> list[OfferedFile]:
    return [
        OfferedFile(index=i, name=name, size_bytes=len(data), mime_type=mime)
        for i, (name, data, mime) in enumerate(files)
    ]


async def test_offered_files_are_in_the_inbox_before_the_first_step_and_listed_in_the_task(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    files = offered(("sales.csv", SALES, "text/csv"), ("notes.txt", b"remember", None))
    host = scripted_host(
        paths,
        [ToolCallReply("bash", {"command": "wc -c < inbox/sales.csv && cat inbox/notes.txt"}), TextReply("done")],
        offered={0: SALES, 1: b"remember"},
        files=files,
        file_notes=["f9 was not given: over the size limit"],
    )

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    inbox = paths.workspace_dir / "inbox"
    assert (inbox / "sales.csv").read_bytes() == SALES
    assert tool_messages(host.requests[1]) == [f"{len(SALES)}\nremember\n[exit code: 0]"]
    assert user_texts(host.requests[0]) == [
        f"{PROMPT}\n\n"
        f"Files from the chat, in {inbox}/:\n"
        f"- sales.csv ({round(len(SALES) / 1024)} KB, text/csv)\n"
        "- notes.txt (8 bytes)\n"
        "- f9 was not given: over the size limit\n"
        "To send a file from the workspace back to the chat, call send_file(path, caption)."
    ]
    assert "2 of 2 files written to" in capsys.readouterr().out


async def test_a_file_the_host_does_not_give_is_a_line_in_the_task_and_the_run_goes_on(paths: ContainerPaths) -> None:
    files = offered(("gone.csv", b"1" * 10, None), ("kept.csv", b"2" * 10, None))
    host = scripted_host(paths, [TextReply("done")], offered={1: b"2" * 10}, files=files)
    host.files.refusals = {f"{FILES_PATH}/0": (410, "the file is no longer kept")}

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert sorted(entry.name for entry in (paths.workspace_dir / "inbox").iterdir()) == ["kept.csv"]
    (prompt,) = user_texts(host.requests[0])
    assert "- kept.csv (10 bytes)\n- gone.csv was not given: the file is no longer kept\n" in prompt


async def test_names_are_listed_as_written_in_the_inbox(paths: ContainerPaths) -> None:
    (paths.workspace_dir / "inbox" / "report.pdf").mkdir(parents=True)
    files = offered(("report.pdf", b"%PDF", "application/pdf"))
    host = scripted_host(paths, [TextReply("done")], offered={0: b"%PDF"}, files=files)

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert (paths.workspace_dir / "inbox" / "report (2).pdf").read_bytes() == b"%PDF"
    (prompt,) = user_texts(host.requests[0])
    assert "- report (2).pdf (4 bytes, application/pdf)\n" in prompt and "- report.pdf" not in prompt


async def test_a_run_without_files_has_no_files_part_and_no_inbox(paths: ContainerPaths) -> None:
    host = scripted_host(paths, [TextReply("done")])

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert user_texts(host.requests[0]) == [PROMPT]
    assert not (paths.workspace_dir / "inbox").exists()


async def test_send_file_reaches_the_host_and_a_refusal_goes_back_to_the_model(paths: ContainerPaths) -> None:
    host = scripted_host(
        paths,
        [
            ToolCallReply("bash", {"command": "printf 'total: 3' > report.txt"}),
            ToolCallReply("send_file", {"path": "report.txt", "caption": "The report"}),
            ToolCallReply("send_file", {"path": "/etc/hostname"}),
            TextReply("sent it"),
        ],
    )

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    (upload,) = host.files.uploads
    assert (upload.meta.name, upload.meta.caption, upload.data) == ("report.txt", "The report", b"total: 3")
    assert tool_messages(host.requests[2])[-1] == "sent report.txt (8 bytes) to the chat (sent)"
    refusal = json.loads(tool_messages(host.requests[3])[-1])["error"]  # a failed call, as the host words it
    assert refusal == f"/etc/hostname is outside the workspace {paths.workspace_dir}; only files under it are sent"
    assert [result.status for result in host.results] == ["completed"]


async def test_the_hosts_refusal_of_an_upload_reaches_the_model(paths: ContainerPaths) -> None:
    (paths.workspace_dir / "a.txt").write_bytes(b"a")
    host = scripted_host(paths, [ToolCallReply("send_file", {"path": "a.txt"}), TextReply("could not")])
    host.files.refusals = {FILES_PATH: (413, "the file is over the limit of 20 MB (SUBAGENT_MAX_FILE_MB)")}

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    (failed,) = tool_messages(host.requests[1])
    assert json.loads(failed) == {
        "error": "a.txt was not sent: the file is over the limit of 20 MB (SUBAGENT_MAX_FILE_MB)"
    }
