"""The `crewbot` command: run, console, migrate, doctor, image build."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from bot.app import App, Stores, SubagentFactory
from bot.channels.base import Channel
from bot.channels.console import CONSOLE_CHAT_ID, ConsoleChannel
from bot.channels.telegram import TelegramChannel
from bot.logging import configure_logging, get_logger
from bot.settings import Settings, SettingsError, load_settings
from bot.store.db import Database, MigrationError

log = get_logger("crewbot")

CONSOLE_SETTLE_SECONDS = 1.5  # after end of input, how long the chat must stay quiet before exiting


def _secrets(settings: Settings) -> list[str]:
    values = [settings.telegram_bot_token, settings.llm_api_key]
    return [v.get_secret_value() for v in values if v is not None]


def _load(args: argparse.Namespace) -> Settings:
    settings = load_settings()
    configure_logging(settings.log_format.value, settings.log_level, _secrets(settings))
    return settings


def subagent_factory(settings: Settings, stores: Stores) -> SubagentFactory:
    from runner.service import build_subagent_system

    return lambda delivery, typing: build_subagent_system(settings, stores, delivery, typing)


async def _serve(settings: Settings, channel: Channel) -> int:
    stores = await Stores.open(settings)
    app = App(settings, channel, stores, subagent_factory(settings, stores))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
    except BaseException:
        await app.stop()
        raise
    try:
        if isinstance(channel, ConsoleChannel):
            await _until_console_done(app, channel, stop)
        else:
            await stop.wait()
    finally:
        log.info("shutting_down")
        await app.stop()
    return 0


async def _until_console_done(app: App, channel: ConsoleChannel, stop: asyncio.Event) -> None:
    waiter = asyncio.create_task(stop.wait())
    eof = asyncio.create_task(channel.eof.wait())
    await asyncio.wait({waiter, eof}, return_when=asyncio.FIRST_COMPLETED)
    # End of input: let the chat's turn and subagents finish so a piped demo shows their results.
    while not stop.is_set():
        done = asyncio.create_task(app.wait_quiet(CONSOLE_CHAT_ID))
        await asyncio.wait({done, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            done.cancel()
            break
        await asyncio.sleep(CONSOLE_SETTLE_SECONDS)
        if app.typing.holders(CONSOLE_CHAT_ID) == 0 and app.engine.idle(CONSOLE_CHAT_ID):
            break
    waiter.cancel()
    eof.cancel()


def _console(settings: Settings) -> ConsoleChannel:
    """The terminal is the chat: logs go to a file so they do not interleave with the conversation."""
    log_path = settings.data_dir / "logs" / "console.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stream = log_path.open("a", encoding="utf-8")  # lives as long as the process
    configure_logging(settings.log_format.value, settings.log_level, _secrets(settings), stream=stream)
    print(f"(logs: {log_path})", file=sys.stderr)
    return ConsoleChannel(settings.assistant_name)


def cmd_run(args: argparse.Namespace) -> int:
    settings = _load(args)
    channel: Channel
    if settings.telegram_bot_token is None:
        log.warning("no_telegram_token", message="TELEGRAM_BOT_TOKEN is not set: starting the console channel")
        channel = _console(settings)
    else:
        channel = TelegramChannel(settings.telegram_bot_token.get_secret_value(), settings.telegram_api_base_url)
    return asyncio.run(_serve(settings, channel))


def cmd_console(args: argparse.Namespace) -> int:
    settings = _load(args)
    return asyncio.run(_serve(settings, _console(settings)))


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _load(args)

    async def migrate() -> int:
        db = await Database.open(settings.db_path)
        version = await db.schema_version()
        await db.close()
        print(f"database {settings.db_path} is at schema version {version}")
        return 0

    return asyncio.run(migrate())


def cmd_doctor(args: argparse.Namespace) -> int:
    from bot.doctor import run_doctor

    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"FAIL settings: {exc}")
        return 1
    configure_logging(settings.log_format.value, "WARNING", _secrets(settings))
    return asyncio.run(run_doctor(settings))


def cmd_image(args: argparse.Namespace) -> int:
    from runner.image import main as image_main

    flags = ["--force"] if args.force else ["--if-missing"] if args.if_missing else []
    return int(image_main(flags))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crewbot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="start the bot (Telegram, or the console when no token is set)").set_defaults(
        func=cmd_run
    )
    sub.add_parser("console", help="chat with the bot from this terminal").set_defaults(func=cmd_console)
    sub.add_parser("migrate", help="create or upgrade the database").set_defaults(func=cmd_migrate)
    sub.add_parser("doctor", help="check settings, database, Telegram, LLM and Docker").set_defaults(func=cmd_doctor)
    image = sub.add_parser("image", help="the subagent image")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build the subagent image (and a local base when none can be pulled)")
    build.add_argument("--if-missing", action="store_true", help="do nothing when the image exists")
    build.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    build.set_defaults(func=cmd_image)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"crewbot: cannot start:\n{exc}", file=sys.stderr)
        return 2
    except MigrationError as exc:
        print(f"crewbot: database: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
