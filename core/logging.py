"""structlog set-up: console or JSON lines, context (chat id, turn id) bound per task, secrets redacted."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.lean_import import without

# structlog's development renderer would bring `rich` where it is installed (development only): the bot formats
# exceptions itself (format_exc_info), so it is left out everywhere, as a production install has it.
with without("rich"):
    import structlog
    from structlog.typing import EventDict, Processor, WrappedLogger

REDACTED = "[redacted]"
LOG_FILE_MAX_BYTES = 10 * 1024 * 1024  # a log file is rotated at this size...
LOG_FILE_BACKUPS = 3  # ...and this many old ones are kept, so logs never fill the disk
HELD_RECORDS_MAX = 10_000  # records held back from the stream during start-up (more are written at once)


class SecretRedactor:
    """Replaces every occurrence of a known secret (bot token, API key) in a rendered log line.

    Working on the final text catches secrets inside any object (URLs, paths, exceptions) that a
    renderer turns into text, which scrubbing individual fields would miss.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)

    def scrub(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, REDACTED)
        return line

    def wrap(self, renderer: Processor) -> Processor:
        def render(logger: WrappedLogger, name: str, event_dict: EventDict) -> str:
            rendered = renderer(logger, name, event_dict)
            text = rendered.decode() if isinstance(rendered, bytes) else str(rendered)
            return self.scrub(text)

        return render


def configure_logging(
    log_format: str = "console",
    level: str = "INFO",
    secrets: Iterable[str] = (),
    stream: Any = None,
    *,
    log_file: Path | None = None,
    to_stream: bool = True,
    hold_stream: bool = False,
) -> None:
    """Route structlog and the standard library (PTB, httpx, docker) through one redacting renderer.

    Lines go to `stream` (stderr by default) unless `to_stream` is false, and to `log_file` (rotated) if given.
    With `hold_stream`, the stream gets nothing until `release_held_logs()` (then everything so far, in order):
    a start that fails is one line on the terminal, a start that succeeds still shows how it went.
    """
    redactor = SecretRedactor(secrets)
    renderer: Processor = (
        structlog.processors.JSONRenderer() if log_format == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redactor.wrap(renderer),
        ],
    )
    handlers: list[logging.Handler] = []
    if log_file is not None:
        handlers.append(
            logging.handlers.RotatingFileHandler(
                log_file, maxBytes=LOG_FILE_MAX_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8"
            )
        )
    if to_stream or log_file is None:
        to_terminal = logging.StreamHandler(stream or sys.stderr)
        handlers.append(to_terminal)
    for handler in handlers:
        handler.setFormatter(formatter)
    if hold_stream and log_file is not None and to_stream:  # held only where the file has it all meanwhile
        handlers[-1] = logging.handlers.MemoryHandler(
            HELD_RECORDS_MAX, flushLevel=logging.CRITICAL + 1, target=to_terminal, flushOnClose=False
        )
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, logging.FileHandler):  # ours from an earlier call: release its file
            old.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    # httpx logs every request URL, and Telegram URLs contain the bot token.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)


def release_held_logs(*, write: bool = True) -> None:
    """Write the records held back from the stream (or drop them: the log file has them), then write to
    the stream directly."""
    root = logging.getLogger()
    for index, handler in enumerate(root.handlers):
        if isinstance(handler, logging.handlers.MemoryHandler) and handler.target is not None:
            target = handler.target
            if write:
                handler.flush()
            handler.buffer.clear()
            root.handlers[index] = target
            handler.close()


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger
