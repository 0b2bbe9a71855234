"""Every way `crewbot run` can fail at start: one line `crewbot: cannot start: <cause>: <fix>`, a non-zero
exit, and the bot token nowhere (not on the terminal, not in the logs). The real command, in a subprocess,
with real settings loading, a real DATA_DIR and the fake Telegram on a thread."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crewbot.startup import keep_private
from tests.crewbot.cli_env import COMMAND_WAIT_SECONDS, SECRET_TOKEN, crewbot_env, run_crewbot
from tests.fakes.telegram_server import FakeTelegram

UNREACHABLE = "http://127.0.0.1:9/bot"  # the discard port: nothing listens there
ROOT = Path(__file__).resolve().parents[2]


def start_failure(tmp_path: Path, data_dir: Path | None = None, *, command: str = "run", **settings: str) -> str:
    """Run the command with the secret token set; return its one line of output, checked."""
    data_dir = data_dir or tmp_path / "data"
    env = crewbot_env(
        data_dir, **{"TELEGRAM_BOT_TOKEN": SECRET_TOKEN, "TELEGRAM_API_BASE_URL": UNREACHABLE, **settings}
    )
    done = run_crewbot([command], env, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert SECRET_TOKEN not in output
    for log in (data_dir / "logs").glob("*.log") if data_dir.is_dir() else ():
        assert SECRET_TOKEN not in log.read_text(encoding="utf-8")
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("crewbot: cannot start: ")
    return lines[0]


def test_a_token_telegram_rejects(tmp_path: Path) -> None:
    with FakeTelegram() as tg:  # knows another token: getMe answers 401
        base_url = tg.base_url
        line = start_failure(tmp_path, TELEGRAM_API_BASE_URL=base_url)

    assert "Telegram rejected TELEGRAM_BOT_TOKEN" in line
    assert f"{base_url}<token>/getMe" in line
    assert "@BotFather" in line


def test_telegram_unreachable(tmp_path: Path) -> None:
    line = start_failure(tmp_path)

    assert f"cannot reach the Telegram Bot API at {UNREACHABLE}<token>/getMe" in line
    assert line.endswith("check the network or proxy, and TELEGRAM_API_BASE_URL")


def test_a_data_dir_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")

    line = start_failure(tmp_path, tmp_path / "a-file" / "data")

    assert "DATA_DIR" in line and "is not usable (Not a directory)" in line
    assert "set DATA_DIR to a folder this user can write" in line


def test_a_data_dir_that_cannot_be_written(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        data_dir = Path("/sys")  # root may write anywhere a permission bit guards, but not here
    else:
        data_dir = tmp_path / "read-only"
        data_dir.mkdir(mode=0o500)

    line = start_failure(tmp_path, data_dir)

    assert f"DATA_DIR {data_dir} is not usable (Permission denied)" in line


def test_a_data_dir_too_long_for_run_sockets(tmp_path: Path) -> None:
    line = start_failure(tmp_path, tmp_path / ("d" * 100))

    assert "is too long" in line and "use a shorter path" in line


def test_a_database_file_that_is_not_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "crewbot.sqlite3").write_bytes(b"this is not an SQLite file" * 10)

    line = start_failure(tmp_path, data_dir)

    assert "crewbot.sqlite3 is not a readable database" in line and "move it aside" in line


@pytest.mark.parametrize("command", ["run", "migrate"])
def test_a_database_newer_than_the_code(tmp_path: Path, command: str) -> None:
    """Written by a later crewbot (a downgrade): the bot must not run on a schema it does not know."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with sqlite3.connect(data_dir / "crewbot.sqlite3") as conn:
        conn.execute("PRAGMA user_version = 9999")

    line = start_failure(tmp_path, data_dir, command=command)

    assert "crewbot.sqlite3 cannot be used (it is at schema version 9999, newer than this crewbot's latest (" in line
    assert line.endswith("run the crewbot version that last used it (or a newer one), or restore a backup made before")


def test_a_database_older_than_the_code_that_cannot_be_migrated(tmp_path: Path) -> None:
    """Its next migration fails (here: the column it adds is already there): one line naming the file and the
    versions, and the database left at its version."""
    data_dir = tmp_path / "data"
    assert run_crewbot(["migrate"], crewbot_env(data_dir), tmp_path).returncode == 0
    with sqlite3.connect(data_dir / "crewbot.sqlite3") as conn:
        latest = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute(f"PRAGMA user_version = {latest - 1}")
    newest = sorted((ROOT / "core" / "store" / "migrations").glob("*.sql"))[-1].name

    line = start_failure(tmp_path, data_dir)

    assert (
        f"crewbot.sqlite3 cannot be upgraded (migration {newest} (schema version {latest - 1} to {latest}) failed"
        in line
    )
    assert line.endswith("restore a backup, or move it aside")
    with sqlite3.connect(data_dir / "crewbot.sqlite3") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == latest - 1


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("SUBAGENT_MEMORY", "lots", "invalid setting SUBAGENT_MEMORY: must be digits with an optional unit"),
        ("ALLOWED_CHAT_IDS", "abc", "invalid setting ALLOWED_CHAT_IDS: must be whole numbers"),
        ("LLM_PROVIDER", "openai", "invalid setting LLM_MODEL: required when LLM_PROVIDER=openai"),
    ],
)
def test_a_bad_setting(tmp_path: Path, setting: str, value: str, expected: str) -> None:
    line = start_failure(tmp_path, None, **{setting: value, "LLM_BASE_URL": "http://127.0.0.1:9/v1"})

    assert expected in line


@pytest.mark.parametrize("command", ["run", "console"])
def test_a_second_bot_on_the_same_data_dir(tmp_path: Path, command: str) -> None:
    with running_console(tmp_path / "data") as first:
        line = start_failure(tmp_path, command=command)

    assert f"another crewbot (pid {first.pid}) is running on DATA_DIR" in line
    assert "give this one its own DATA_DIR" in line


class running_console:
    """`crewbot console` with piped input that stays open: it runs until the pipe closes."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> subprocess.Popen[str]:
        env = crewbot_env(self._data_dir)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "crewbot", "console"],
            env=env,
            cwd=self._data_dir.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        log = self._data_dir / "logs" / "console.log"
        deadline = time.monotonic() + COMMAND_WAIT_SECONDS
        while not (log.exists() and "crewbot_started" in log.read_text(encoding="utf-8")):
            assert self._process.poll() is None, "the first console did not start"
            assert time.monotonic() < deadline, "the first console did not start in time"
            time.sleep(0.1)
        return self._process

    def __exit__(self, *exc_info: object) -> None:
        assert self._process is not None
        assert self._process.stdin is not None
        self._process.stdin.close()  # end of input: it stops by itself
        try:
            self._process.wait(COMMAND_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def test_data_dir_is_closed_to_other_local_users(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)  # whatever the umask made of it
    keep_private(data_dir)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    keep_private(data_dir)  # already private: left alone
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
