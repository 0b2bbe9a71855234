"""Why crewbot cannot start, in one line: checks made before anything opens, and every start-up failure
turned into `cause: fix`. Never a traceback on the terminal, never a secret (the traceback goes to the log).

Used by the CLI only (it is part of the composition root).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import stat
import tempfile
import traceback
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

from core.logging import SecretRedactor
from core.settings import Settings
from core.store.db import MigrationError

LOCK_FILE = "crewbot.lock"
# DATA_DIR/channels/<12-hex run id>/run.sock must fit a Unix socket address (108 bytes with its NUL).
MAX_UNIX_SOCKET_PATH_BYTES = 107
RUN_SOCKET_SUFFIX = "/channels/0123456789ab/run.sock"
MAX_DETAIL_CHARS = 200  # an error's own words, as quoted in the one line
# integrity_check took 1.3 s for 532 MiB here (quick_check 0.6 s): under this size start-up runs the full one.
FULL_CHECK_AT_START_MAX_BYTES = 256 * 1024 * 1024
MAX_INTEGRITY_ERRORS = 3  # damage reports asked of SQLite: the first says enough (unbounded, it may raise instead)
RESTORE_FIX = (
    "stop crewbot, move it aside with its -wal and -shm files, and copy your backup in its place "
    "(docs/operating.md: Backup and restore); with no backup, moving it aside starts afresh"
)


class IntegrityCheck(StrEnum):
    """How closely the database is read before use: both read every page, so damage the bot would trip
    over on some later message is found now."""

    QUICK = "quick_check"  # start-up of a large database: every page and record, no index cross-checks (O(N))
    FULL = "integrity_check"  # doctor, and start-up of one up to 256 MiB: also that every index agrees


class StartupError(Exception):
    """Cannot start: the message is one line, `cause: fix`."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}: {fix}")
        self.cause = cause
        self.fix = fix


def secrets_of(settings: Settings | None) -> list[str]:
    if settings is None:
        return []
    values = [
        settings.telegram_bot_token,
        settings.llm_api_key,
        settings.telegram_webhook_secret,
        settings.stt_api_key,
    ]
    return [v.get_secret_value() for v in values if v is not None]


def _detail(exc: BaseException | str) -> str:
    words = " ".join(str(exc).split()) or type(exc).__name__
    return words if len(words) <= MAX_DETAIL_CHARS else words[: MAX_DETAIL_CHARS - 1] + "…"


def _os_reason(exc: OSError) -> str:
    return exc.strerror or _detail(exc)


def check_data_dir(data_dir: Path) -> None:
    """DATA_DIR exists (made if missing), is a folder we can write, and is short enough for run sockets."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        raise StartupError(
            f"DATA_DIR {data_dir} is not usable ({_os_reason(exc)})",
            "set DATA_DIR to a folder this user can write, or fix its permissions",
        ) from None
    socket_bytes = len(os.fsencode(str(data_dir) + RUN_SOCKET_SUFFIX))
    if socket_bytes > MAX_UNIX_SOCKET_PATH_BYTES:
        raise StartupError(
            f"DATA_DIR {data_dir} is too long (its run sockets need {socket_bytes} bytes, Unix sockets "
            f"allow {MAX_UNIX_SOCKET_PATH_BYTES})",
            "use a shorter path (a relative one works)",
        )


def keep_private(data_dir: Path) -> None:
    """DATA_DIR holds every chat's history, sessions and results: other local users get no way in. Only
    the folder itself needs closing (containers reach their parts through bind mounts, not through it)."""
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077 and data_dir.stat().st_uid == os.geteuid():
        data_dir.chmod(mode & 0o700)


def start_check(db_path: Path) -> IntegrityCheck:
    """The full check for a database small enough to read in about a second; the quick one for a larger one
    (it misses an index that no longer agrees with its table: `crewbot doctor` finds that)."""
    size = db_path.stat().st_size if db_path.exists() else 0
    return IntegrityCheck.FULL if size <= FULL_CHECK_AT_START_MAX_BYTES else IntegrityCheck.QUICK


def check_database(db_path: Path, check: IntegrityCheck | None = None) -> None:
    """Open the database file once with the standard library and read it through, so a broken one is
    named before start-up (a damaged page otherwise passes the open and fails every message later)."""
    if not db_path.exists():
        return
    check = check or start_check(db_path)
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(db_path, timeout=5)
        conn.execute("PRAGMA schema_version").fetchone()
        found = [str(row[0]) for row in conn.execute(f"PRAGMA {check.value}({MAX_INTEGRITY_ERRORS})")]
    except sqlite3.DatabaseError as exc:
        raise StartupError(*database_problem(db_path, exc)) from None
    finally:
        if conn is not None:
            conn.close()
    if found != ["ok"]:
        raise StartupError(
            f"the database {db_path} is corrupt ({check.value}: {_detail('; '.join(found))})", RESTORE_FIX
        )


def database_problem(db_path: Path, exc: BaseException) -> tuple[str, str]:
    """(cause, fix) for a database that cannot be opened or upgraded."""
    text = _detail(exc)
    if "locked" in text:
        return f"the database {db_path} is locked by another process", "stop that process, then start crewbot again"
    if "not a database" in text:
        return f"{db_path} is not a readable database ({text})", RESTORE_FIX
    if "malformed" in text:
        return f"the database {db_path} is corrupt ({text})", RESTORE_FIX
    if isinstance(exc, MigrationError) and exc.fix is not None:  # newer than the code, or no migrations shipped
        return f"the database {db_path} cannot be used ({text})", exc.fix
    if isinstance(exc, MigrationError):
        return f"the database {db_path} cannot be upgraded ({text})", "restore a backup, or move it aside"
    return f"the database {db_path} cannot be opened ({text})", "check DATA_DIR and its permissions"


@dataclass
class DataDirLock:
    """Held for the process's life: a second bot on the same DATA_DIR would fight the first over its
    containers (each one's recovery removes what it does not know)."""

    file: IO[str]

    def release(self) -> None:
        self.file.close()


def lock_data_dir(data_dir: Path) -> DataDirLock:
    path = data_dir / LOCK_FILE
    file = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.seek(0)
        holder = file.read().strip() or "unknown"
        file.close()
        raise StartupError(
            f"another crewbot (pid {holder}) is running on DATA_DIR {data_dir}",
            "stop it first (in its console: /quit), or give this one its own DATA_DIR",
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    return DataDirLock(file)


def telegram_problem(exc: BaseException, base_url: str) -> tuple[str, str] | None:
    """(cause, fix) for a failed getMe: the URL it tried (the token shown as <token>) and what to do."""
    from telegram.error import InvalidToken, NetworkError, TelegramError

    url = f"{base_url}<token>/getMe"
    if isinstance(exc, InvalidToken):
        return (
            f"Telegram rejected TELEGRAM_BOT_TOKEN ({url} answered 401 or 404)",
            "copy the token again from @BotFather, or leave TELEGRAM_BOT_TOKEN empty to chat in the console",
        )
    if isinstance(exc, NetworkError):
        return (
            f"cannot reach the Telegram Bot API at {url} ({_detail(exc).removeprefix('httpx.')})",
            "check the network or proxy, and TELEGRAM_API_BASE_URL",
        )
    if isinstance(exc, TelegramError):
        return f"the Telegram Bot API at {url} refused ({_detail(exc)})", "check TELEGRAM_BOT_TOKEN"
    return None


def explain(exc: BaseException, settings: Settings | None, log_file: Path | None = None) -> str:
    """One line, `cause: fix`, for any exception that stopped start-up; secrets replaced."""
    from bot.channels.webhook import WebhookProblem
    from runner.kube.kube_errors import KubeConfigError

    problem: tuple[str, str] | None = None
    if isinstance(exc, StartupError | WebhookProblem | KubeConfigError):
        problem = exc.cause, exc.fix
    elif settings is not None:
        problem = telegram_problem(exc, settings.telegram_api_base_url)
        if problem is None and isinstance(exc, sqlite3.Error | MigrationError):
            problem = database_problem(settings.db_path, exc)
    if problem is None and isinstance(exc, OSError):
        where = exc.filename or (settings.data_dir if settings else "a file")
        problem = f"{where}: {_os_reason(exc)}", "check DATA_DIR and that this user can write there"
    if problem is None:
        where = f"the traceback is in {log_file}" if log_file is not None else "run it again with LOG_LEVEL=DEBUG"
        problem = f"unexpected {type(exc).__name__} ({_detail(exc)})", where
    return SecretRedactor(secrets_of(settings)).scrub(": ".join(problem))


def keep_traceback(exc: BaseException, log_file: Path | None, settings: Settings | None) -> None:
    """The traceback belongs in the log, not on the terminal: append it there, secrets replaced."""
    if log_file is None:
        return
    text = "".join(traceback.format_exception(exc))
    with contextlib.suppress(OSError), log_file.open("a", encoding="utf-8") as file:
        file.write(SecretRedactor(secrets_of(settings)).scrub(f"crewbot could not start:\n{text}"))
