"""Logging: every secret is redacted wherever it appears, in console and JSON output, structlog and stdlib."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog

from core.logging import REDACTED, configure_logging, get_logger, release_held_logs

TOKEN = "123456789:AAH-secret-bot-token"
API_KEY = "sk-test-0123456789abcdef"
FORMATS = ["console", "json"]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put it back for the rest of the suite."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quieted = {name: logging.getLogger(name).level for name in ("httpx", "httpx2")}
    config = structlog.get_config()
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in quieted.items():
        logging.getLogger(name).setLevel(old)


def configured(log_format: str) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(log_format, "INFO", secrets=[TOKEN, API_KEY], stream=stream)
    return stream


def assert_redacted(output: str, *, times: int = 1) -> None:
    assert TOKEN not in output
    assert API_KEY not in output
    assert output.count(REDACTED) >= times


@pytest.mark.parametrize("log_format", FORMATS)
def test_secret_in_event_is_redacted(log_format: str) -> None:
    stream = configured(log_format)

    get_logger("test").info(f"calling https://api.telegram.org/bot{TOKEN}/getMe")

    output = stream.getvalue()
    assert_redacted(output)
    assert "https://api.telegram.org/bot[redacted]/getMe" in output


@pytest.mark.parametrize("log_format", FORMATS)
def test_secret_in_keyword_values_is_redacted(log_format: str) -> None:
    stream = configured(log_format)

    get_logger("test").warning(
        "request_failed", url=f"https://x/bot{TOKEN}/send", headers={"Authorization": f"Bearer {API_KEY}"}
    )

    output = stream.getvalue()
    assert_redacted(output, times=2)
    assert "request_failed" in output


@pytest.mark.parametrize("log_format", FORMATS)
def test_secret_in_exception_message_is_redacted(log_format: str) -> None:
    stream = configured(log_format)
    log = get_logger("test")

    try:
        raise RuntimeError(f"401 Unauthorized for key {API_KEY}")
    except RuntimeError:
        log.exception("llm_failed")
    try:
        raise ValueError(f"bad token {TOKEN}")
    except ValueError as exc:
        log.error("send_failed", error=exc)

    output = stream.getvalue()
    assert_redacted(output, times=2)
    assert "RuntimeError" in output
    assert "401 Unauthorized for key [redacted]" in output


@pytest.mark.parametrize("log_format", FORMATS)
def test_stdlib_logger_is_redacted(log_format: str) -> None:
    stream = configured(log_format)

    logging.getLogger("telegram.ext").warning("polling %s failed", f"https://api.telegram.org/bot{TOKEN}/getUpdates")
    try:
        raise ConnectionError(f"cannot reach bot{TOKEN}")
    except ConnectionError:
        logging.getLogger("telegram").exception("network error")

    output = stream.getvalue()
    assert_redacted(output, times=2)
    assert "telegram.ext" in output
    assert "network error" in output


def test_json_output_is_one_object_per_line() -> None:
    stream = configured("json")

    get_logger("test").info("hello", chat_id=5, token=TOKEN)

    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "hello"
    assert record["chat_id"] == 5
    assert record["token"] == REDACTED
    assert record["level"] == "info"


def test_bound_context_is_redacted_too() -> None:
    stream = configured("json")

    with structlog.contextvars.bound_contextvars(url=f"bot{TOKEN}"):
        get_logger("test").info("in_context")

    record = json.loads(stream.getvalue())
    assert record["url"] == f"bot{REDACTED}"


def test_short_secrets_are_not_redacted_everywhere() -> None:
    """A blank or tiny 'secret' would otherwise scramble every line."""
    stream = io.StringIO()
    configure_logging("json", "INFO", secrets=["", "abc"], stream=stream)

    get_logger("test").info("abc def")

    assert json.loads(stream.getvalue())["event"] == "abc def"


def test_httpx_request_lines_are_quieted() -> None:
    configured("console")

    assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING


@pytest.mark.parametrize("log_format", FORMATS)
def test_secret_inside_a_url_object_is_redacted(log_format: str) -> None:
    stream = configured(log_format)

    get_logger("test").info("request", url=httpx.URL(f"https://api.telegram.org/bot{TOKEN}/getMe"))

    assert TOKEN not in stream.getvalue()


def test_a_log_file_gets_every_line_and_the_stream_only_when_asked(tmp_path: Path) -> None:
    stream = io.StringIO()
    log_file = tmp_path / "console.log"

    configure_logging("console", "INFO", secrets=[TOKEN], stream=stream, log_file=log_file, to_stream=False)
    get_logger("test").info("to_the_file", token=TOKEN)
    logging.getLogger().handlers[0].flush()

    written = log_file.read_text(encoding="utf-8")
    assert "to_the_file" in written
    assert_redacted(written)
    assert stream.getvalue() == ""


def test_held_lines_reach_the_stream_only_once_released(tmp_path: Path) -> None:
    stream = io.StringIO()
    log_file = tmp_path / "crewbot.log"
    configure_logging("console", "INFO", secrets=[TOKEN], stream=stream, log_file=log_file, hold_stream=True)

    get_logger("test").error("while_starting", token=TOKEN)
    assert stream.getvalue() == ""  # a start that fails here shows one line, not the log
    release_held_logs()
    get_logger("test").info("after_start")

    lines = stream.getvalue().splitlines()
    assert ["while_starting" in lines[0], "after_start" in lines[1]] == [True, True]
    assert_redacted(stream.getvalue())
    assert "while_starting" in log_file.read_text(encoding="utf-8")
