"""The console as people use it: the real `crewbot console` process, piped or on a pseudo-terminal, on a real
DATA_DIR. It answers after a restart, Ctrl-C and Ctrl-D end it at once, arrow keys edit the line."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.channels.terminal import plain
from tests.bot.terminal import TerminalProcess
from tests.crewbot.cli_env import COMMAND_WAIT_SECONDS, crewbot_env, run_crewbot

PROMPT = "> "
CTRL_C, CTRL_D, LEFT = "\x03", "\x04", "\x1b[D"
REPLY_WAIT_SECONDS = 30.0
EXIT_WAIT_SECONDS = 1.0  # what the issue asks of Ctrl-C and Ctrl-D


def stored_texts(data_dir: Path) -> list[str]:
    conn = sqlite3.connect(data_dir / "crewbot.sqlite3")
    try:
        rows = conn.execute("SELECT content FROM messages WHERE is_bot = 0 ORDER BY id").fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[TerminalProcess]:
    """`crewbot console` on a pseudo-terminal, at its prompt."""
    env = crewbot_env(tmp_path / "data", TERM="xterm")
    process = TerminalProcess([sys.executable, "-m", "crewbot", "console"], env, str(tmp_path))
    try:
        process.expect(PROMPT, COMMAND_WAIT_SECONDS)
        yield process
    finally:
        process.close()


def test_after_a_restart_on_the_same_data_dir_the_first_message_is_answered(tmp_path: Path) -> None:
    env = crewbot_env(tmp_path / "data")

    first = run_crewbot(["console"], env, tmp_path, stdin="hello\n")
    second = run_crewbot(["console"], env, tmp_path, stdin="hello again\n")

    assert "wrote: “hello”" in first.stdout, first.stdout + first.stderr
    # Console message ids used to restart at 1 and be ignored as duplicates of the stored ones.
    assert "wrote: “hello again”" in second.stdout, second.stdout + second.stderr
    assert stored_texts(tmp_path / "data") == ["hello", "hello again"]


def test_ctrl_c_ends_the_console_at_once_saying_what_keeps_running(console: TerminalProcess) -> None:
    console.send("half a line")
    started = time.monotonic()
    console.send(CTRL_C)

    code = console.wait_exit(EXIT_WAIT_SECONDS)

    assert code is not None, f"still running {time.monotonic() - started:.1f} s after Ctrl-C:\n{console.output}"
    assert "Bye. Nothing is left running." in console.output


def test_ctrl_d_ends_it_at_once_too(console: TerminalProcess) -> None:
    console.send(CTRL_D)

    assert console.wait_exit(EXIT_WAIT_SECONDS) == 0, console.output


def test_arrow_keys_edit_the_line_and_long_lines_arrive_whole(console: TerminalProcess, tmp_path: Path) -> None:
    console.send(f"helo{LEFT}l\r")  # Left arrow, then the missing letter
    console.expect("wrote: “hello”", REPLY_WAIT_SECONDS)
    long_line = "word " * 1000  # 5,000 characters: a terminal's own line editing cuts at 4,095
    console.send(long_line.strip() + "\r")
    console.expect("wrote: “word word", REPLY_WAIT_SECONDS)
    console.send("/quit\r")
    assert console.wait_exit(REPLY_WAIT_SECONDS) == 0

    assert stored_texts(tmp_path / "data") == ["hello", long_line.strip()]


def test_help_shows_above_the_prompt_and_names_quit(console: TerminalProcess) -> None:
    console.send("/help\r")

    console.expect("/quit (or Ctrl-D, Ctrl-C)", REPLY_WAIT_SECONDS)
    console.expect_last(f"report at the next start\r\n{PROMPT}", REPLY_WAIT_SECONDS)  # the prompt is back below
    assert "Mention me" not in console.output


def test_markdown_reads_as_plain_text_on_a_terminal() -> None:
    assert plain("run `abc123` is **done**") == "run abc123 is done"
    assert plain("```\nkeep `this`\n```") == "```\nkeep `this`\n```"


def test_terminal_control_from_replies_never_reaches_the_terminal() -> None:
    assert plain("a\x1b]0;title\x07b\x1b[2Jc\rd\x9be") == "a]0;titleb[2Jcde"
    assert plain("tabs\tand\nnewlines stay") == "tabs\tand\nnewlines stay"


def stored_files(data_dir: Path) -> list[tuple[str, str, int, str]]:
    conn = sqlite3.connect(data_dir / "crewbot.sqlite3")
    try:
        rows = conn.execute(
            "SELECT f.name, f.kind, f.size_bytes, m.content FROM chat_files f JOIN messages m ON m.id = f.message_id"
        ).fetchall()
    finally:
        conn.close()
    return [(str(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]


def test_file_attaches_a_local_file_that_the_main_agent_then_sees(tmp_path: Path) -> None:
    (tmp_path / "my data.csv").write_text("month,total\njan,3\n")
    env = crewbot_env(tmp_path / "data")

    done = run_crewbot(
        ["console"], env, tmp_path, stdin='/file "my data.csv" how many rows?\n/file missing.csv\n/file\n'
    )

    assert "(attached my data.csv, 18 bytes)" in done.stdout, done.stdout + done.stderr
    # The offline model quotes the message as the prompt shows it: the file with its id, then the text.
    assert "[file f1: my data.csv, text/csv, 18 bytes] how many rows?" in done.stdout
    assert "(no file attached: missing.csv: No such file or directory)" in done.stdout
    assert "(no file attached: usage: /file PATH [text]" in done.stdout
    assert stored_files(tmp_path / "data") == [("my data.csv", "document", 18, "how many rows?")]
