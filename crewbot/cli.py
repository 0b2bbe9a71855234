"""The `crewbot` command: run, console, logs, migrate, doctor, config, stats, image build.

Every way a command can fail to start ends in `crewbot: cannot start: <cause>: <fix>` on stderr (one line
per cause) and a non-zero exit; tracebacks go to the log file, secrets nowhere.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from core.lean_import import import_telegram
from core.logging import configure_logging, get_logger, release_held_logs
from core.malloc_arenas import limit_malloc_arenas
from core.settings import LLMProvider, Settings, SettingsError, load_settings
from crewbot.startup import (
    DataDirLock,
    StartupError,
    check_data_dir,
    check_database,
    explain,
    keep_private,
    keep_traceback,
    lock_data_dir,
    secrets_of,
)

log = get_logger("crewbot")

CANNOT_START = "crewbot: cannot start: "
STARTS = frozenset({"run", "console", "migrate"})  # commands whose failure means the bot cannot start
EXIT_CANNOT_START = 2
EXIT_CRASHED = 1
EXIT_INTERRUPTED = 130
NO_TOKEN_NOTE = (
    "TELEGRAM_BOT_TOKEN is not set, so this is the console (docs/telegram.md: Putting it in a Telegram group)."
)
CONSOLE_FILES_DIR = "console-files"  # under DATA_DIR: files subagents send to the console
LOGS_TAIL_CHARS = 10_000  # `crewbot logs` shows this much of a run's output by default


def _log_file(settings: Settings, name: str) -> Path:
    return settings.data_dir / "logs" / name


def _prepare(settings: Settings) -> DataDirLock:
    """Checks before anything opens, then the DATA_DIR lock that the bot holds while it runs."""
    check_data_dir(settings.data_dir)
    keep_private(settings.data_dir)
    check_database(settings.db_path)
    _log_file(settings, "").mkdir(parents=True, exist_ok=True)
    return lock_data_dir(settings.data_dir)


def _quiet_pydantic_ai() -> None:
    # Its first-run banner would land in the middle of the chat. The variable, not pydantic_ai.BANNER_ENABLED:
    # pydantic-ai is imported on the first turn, not at start (bot/agent/main_agent.py).
    os.environ.setdefault("PYDANTIC_AI_NO_BANNER", "1")


def _intro(settings: Settings, log_file: Path, why: str | None) -> list[str]:
    lines = [why] if why else []
    if settings.llm_provider is LLMProvider.OFFLINE:
        lines.append(
            "Model: the offline demo model (no LLM configured): it answers from a script; "
            "`background: $ echo hello` starts a subagent."
        )
    else:
        lines.append(f"Model: {settings.llm_model} ({settings.llm_provider.value}).")
    lines.append(
        "Files: `/file PATH [text]` posts a local file (a subagent finds it in inbox/); files a subagent sends "
        f"are saved in {settings.data_dir / CONSOLE_FILES_DIR}."
    )
    lines.append(f"Logs: {log_file}")
    return lines


def _console(settings: Settings, why: str | None = None) -> int:
    from bot.channels.console import ConsoleChannel
    from crewbot.serve import serve, subagent_runtime, subagents_readiness

    lock = _prepare(settings)
    limit_malloc_arenas()  # before the bot starts its threads: core/malloc_arenas.py
    log_file = _log_file(settings, "console.log")
    # The terminal is the chat: logs go to a file only, so they do not interleave with the conversation.
    configure_logging(
        settings.log_format.value, settings.log_level, secrets_of(settings), log_file=log_file, to_stream=False
    )
    _quiet_pydantic_ai()

    async def session() -> int:
        runtime = subagent_runtime(settings)
        intro = [*_intro(settings, log_file, why), await subagents_readiness(settings, runtime)]
        channel = ConsoleChannel(settings.assistant_name, intro=intro, files_dir=settings.data_dir / CONSOLE_FILES_DIR)
        return await serve(settings, channel, runtime)

    try:
        return asyncio.run(session())
    finally:
        lock.release()


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    if settings.telegram_bot_token is None:
        return _console(settings, NO_TOKEN_NOTE)
    import_telegram()  # first, without what it would import for features the bot does not use
    from bot.channels.telegram import TelegramChannel
    from bot.channels.webhook import WebhookConfig
    from crewbot.serve import serve, subagent_runtime

    lock = _prepare(settings)
    limit_malloc_arenas()  # before the bot starts its threads: core/malloc_arenas.py
    log_file = _log_file(settings, "crewbot.log")
    # Until the bot is up, stderr's log lines are held back: a failed start is one line on the terminal.
    configure_logging(
        settings.log_format.value, settings.log_level, secrets_of(settings), log_file=log_file, hold_stream=True
    )
    _quiet_pydantic_ai()
    channel = TelegramChannel(
        settings.telegram_bot_token.get_secret_value(),
        settings.telegram_api_base_url,
        webhook=WebhookConfig.of(settings),  # None: long polling
    )

    def started() -> None:
        release_held_logs()
        log.info("logging_to", stream="stderr", file=str(log_file))

    try:
        return asyncio.run(serve(settings, channel, subagent_runtime(settings), on_started=started))
    finally:
        release_held_logs(write=False)  # only still held if the start failed: that is one line, not a log
        lock.release()


def cmd_console(args: argparse.Namespace, settings: Settings) -> int:
    return _console(settings)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from core.store.db import Database

    check_data_dir(settings.data_dir)
    check_database(settings.db_path)

    async def migrate() -> int:
        db = await Database.open(settings.db_path)
        version = await db.schema_version()
        await db.close()
        print(f"database {settings.db_path} is at schema version {version}")
        return 0

    return asyncio.run(migrate())


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from crewbot.doctor import run_doctor

    configure_logging(settings.log_format.value, "WARNING", secrets_of(settings))
    return asyncio.run(run_doctor(settings))


def cmd_logs(args: argparse.Namespace, settings: Settings) -> int:
    from crewbot.logs_command import show_logs

    if not settings.db_path.exists():
        raise StartupError(f"no database at {settings.db_path} yet", "start the bot first, or check DATA_DIR")
    check_database(settings.db_path)
    configure_logging(settings.log_format.value, "WARNING", secrets_of(settings))
    return asyncio.run(show_logs(settings, args.run_id, args.chars, follow=args.follow))


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    from crewbot.config_command import set_config, show_config

    configure_logging(settings.log_format.value, "WARNING", secrets_of(settings))
    if args.config_command == "set":
        return asyncio.run(set_config(settings, args.assignments))
    check_database(settings.db_path)
    return asyncio.run(show_config(settings))


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    from crewbot.stats_command import parse_since, show_stats

    if not settings.db_path.exists():
        raise StartupError(f"no database at {settings.db_path} yet", "start the bot first, or check DATA_DIR")
    check_database(settings.db_path)
    try:
        parse_since(args.since)
    except ValueError as exc:
        raise StartupError(str(exc), "e.g. --since 7d, 24h or 30m") from None
    if args.plot is not None:
        from crewbot.stats_plot import require_pillow

        require_pillow()
    configure_logging(settings.log_format.value, "WARNING", secrets_of(settings))
    return asyncio.run(show_stats(settings, args.since, args.chat, args.json, args.plot))


def cmd_image(args: argparse.Namespace) -> int:
    from runner.runtimes.image import main as image_main

    flags = ["--force"] if args.force else ["--if-missing"] if args.if_missing else []
    return int(image_main([*flags, *(["--image", args.image] if args.image else [])]))


def _version() -> str:
    try:
        return version("crewbot")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crewbot", description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"crewbot {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, summary: str, description: str, func: Callable[..., int]) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=summary, description=description)
        command.set_defaults(func=func)
        return command

    add(
        "run",
        "start the bot (Telegram, or the console when no token is set)",
        "Start the bot on Telegram with TELEGRAM_BOT_TOKEN; without one, open the console. Settings come from the "
        "environment and .env. Logs go to stderr and DATA_DIR/logs/crewbot.log. Stop with Ctrl-C or SIGTERM: "
        "running subagents keep going and are picked up at the next start.",
        cmd_run,
    )
    add(
        "console",
        "chat with the bot from this terminal",
        "Chat with the bot in a local group chat from this terminal, with the same engine, store and subagents "
        "as on Telegram. Logs go to DATA_DIR/logs/console.log. Leave with /quit, Ctrl-D or Ctrl-C.",
        cmd_console,
    )
    logs = add(
        "logs",
        "show what a subagent run has printed",
        "Show the output of a subagent run so far (while it runs: its container's output; after it ended: the "
        "log kept in DATA_DIR/runs/<run id>/), after the files it was given and sent and its connections through "
        "the egress door (totals and the last 20). Run ids are in the chat's /subagents list.",
        cmd_logs,
    )
    logs.add_argument("run_id", help="the run's id, as /subagents lists it")
    logs.add_argument("--chars", type=_positive, default=LOGS_TAIL_CHARS, help="how much of the end to show")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the run ends")
    add(
        "migrate",
        "create or upgrade the database",
        "Create DATA_DIR/crewbot.sqlite3 or apply pending migrations (the bot also does this at start).",
        cmd_migrate,
    )
    add(
        "doctor",
        "check settings, database, Telegram, LLM and Docker",
        "Check every dependency, one line each (ok, FAIL or skip); each failure says how to fix it. "
        "Exits non-zero when a check fails.",
        cmd_doctor,
    )
    config = add(
        "config",
        "show the bot's settings, or change one on the running bot",
        "`show`: every setting in force and where it came from (default, env, .env, live override). `set NAME=VALUE"
        " ...`: change a live setting on the running bot through its control socket (DATA_DIR/control.sock): "
        "validated as at start-up, from the next run's start, kept across restarts, logged with who made it.",
        cmd_config,
    )
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    config_sub.add_parser("show", help="every setting in force and where it came from")
    config_set = config_sub.add_parser("set", help="change live settings: NAME=VALUE ...")
    config_set.add_argument("assignments", nargs="+", metavar="NAME=VALUE")
    stats = add(
        "stats",
        "what subagent runs used and LLM calls cost; a suggested MAX_CONCURRENT_SUBAGENTS and daily allowances",
        "Over the period: runs by outcome, queue wait p50/p95, refusals, share of time at the cap, peak "
        "concurrency, memory and CPU per run p50/p95, tokens per chat, files in and out, web connections (refused "
        "among them) and bytes through the egress door; then what the host holds by memory and "
        "by CPU, what demand needed, and the suggested cap. Then spend per day (in TIMEZONE) and chat: tokens in "
        "and out by kind (main, announce, subagent, scheduled), calls, estimated calls, money at the configured "
        "prices, totals per chat; and CHAT_DAILY_TOKENS and DAILY_TOKENS suggested from the p95 day with 1.5x "
        "headroom (3 days of spend needed). Apply suggestions with `crewbot config set`.",
        cmd_stats,
    )
    stats.add_argument("--since", default="7d", help="how far back: 30m, 24h, 7d, 2w (default 7d)")
    stats.add_argument("--chat", type=int, default=None, metavar="ID", help="one chat's runs and spend only")
    stats.add_argument("--json", action="store_true", help="print JSON instead of lines")
    stats.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="draw concurrency over time")
    image = sub.add_parser("image", help="the subagent image", description="Build the Docker image subagents run in.")
    image_sub = image.add_subparsers(dest="image_command", required=True, metavar="COMMAND")
    build = image_sub.add_parser(
        "build",
        help="build the subagent image",
        description="Build the subagent image (and a local base image when none can be pulled), with the tools "
        "SUBAGENT_IMAGE_PACKAGES (pip) and SUBAGENT_IMAGE_APT (Debian) ask for, fetched on this host: containers "
        "never reach the network for them. Does nothing when the image is current.",
    )
    build.add_argument("--if-missing", action="store_true", help="do nothing when the image exists")
    build.add_argument("--force", action="store_true", help="rebuild (and refetch the tools) even when current")
    build.add_argument(
        "--image", default=None, metavar="NAME:TAG", help="the name to build (default crewbot-agent:latest)"
    )
    build.set_defaults(func=cmd_image)
    return parser


def _fail(lines: Sequence[str], prefix: str = CANNOT_START) -> None:
    for line in lines:
        print(f"{prefix}{line}", file=sys.stderr)


def run(argv: Sequence[str] | None = None) -> int:
    """The command, for tests: the exit code, with every failure already reported in one line."""
    args = build_parser().parse_args(argv)
    if args.command == "image":
        return cmd_image(args)
    settings: Settings | None = None
    log_file: Path | None = None
    try:
        settings = load_settings()
        log_file = _log_file(settings, "console.log" if _is_console(args, settings) else "crewbot.log")
        return int(args.func(args, settings))
    except SettingsError as exc:
        if args.command == "doctor":
            from crewbot.doctor import report_bad_settings

            return report_bad_settings(exc.lines)
        _fail(exc.lines)
        return EXIT_CANNOT_START
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        from crewbot.serve import Crashed, StartFailed

        cause = exc.__cause__ if isinstance(exc, StartFailed | Crashed) and exc.__cause__ else exc
        logged = log_file if log_file is not None and log_file.parent.is_dir() else None
        if isinstance(exc, Crashed):
            # It had started, so its log is open: the traceback goes there as a crash, not as a failed start.
            log.critical("crewbot_crashed", error=str(cause), error_type=type(cause).__name__, exc_info=cause)
            _fail([explain(cause, settings, logged)], prefix="crewbot: stopped: ")
            return EXIT_CRASHED
        if not isinstance(cause, StartupError):
            keep_traceback(cause, logged, settings)
        _fail([explain(cause, settings, logged)], prefix=CANNOT_START if args.command in STARTS else "crewbot: ")
        return EXIT_CANNOT_START


def _is_console(args: argparse.Namespace, settings: Settings) -> bool:
    return bool(args.command == "console" or (args.command == "run" and settings.telegram_bot_token is None))


def main(argv: Sequence[str] | None = None) -> int:
    """The program: `run`, then leave at once.

    Everything is written and closed by then. Interpreter teardown would still join engine calls blocked
    in worker threads (a Docker wait slice, a ping to an unreachable DOCKER_HOST) and garbage-collect a
    large heap, which made Ctrl-C take seconds; neither has anything left to do.
    """
    code = run(argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
