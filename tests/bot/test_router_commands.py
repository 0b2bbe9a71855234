"""Chat commands through the router: stored but never a turn, admin checks, run control (/cancel,
/subagents, /stop), /help in the console, /workspace."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.commands import MAX_LISTED_RUNS, Commands
from bot.flood import FloodGuard
from bot.ports.runs import RunSummary
from bot.router import InboundRouter
from bot.turns.engine import ChatEngine
from core.settings import load_settings
from core.store import ChatStore, MessageStore
from core.store.db import Database
from core.store.runs import RunStatus
from core.typing_indicator import TypingIndicator
from tests.bot.helpers import (
    WAIT_SECONDS,
    ControlledRunner,
    FakeRunControl,
    RecordingChannel,
    RecordingLifecycle,
    inbound,
    make_delivery,
)
from tests.bot.router_helpers import ADMIN, ALLOWED, MEMBER, Bot, handle_command


async def test_commands_are_stored_but_never_trigger_a_turn(bot: Bot) -> None:
    reply = await handle_command(bot, "/help")

    assert "/subagents" in reply
    assert bot.engine.idle(ALLOWED)
    stored = await bot.stored(ALLOWED)
    assert stored[0].content == "/help"
    assert stored[0].is_trigger is False
    assert stored[-1].is_bot is True  # the reply is stored as the bot's own


async def test_cancel_by_a_non_admin_in_a_group_is_refused(bot: Bot) -> None:
    reply = await handle_command(bot, "/cancel run-1", sender_id=MEMBER)

    assert reply == "Crew: Only chat admins can use /cancel."
    assert bot.channel.admin_checks == [(ALLOWED, MEMBER)]
    assert bot.runs.calls == []


async def test_cancel_by_a_configured_admin_is_accepted(bot: Bot) -> None:
    reply = await handle_command(bot, "/cancel run-1", sender_id=ADMIN)

    assert reply == "Crew: Cancelled run run-1."
    assert bot.runs.calls == [("cancel_run", ALLOWED, "run-1")]
    assert bot.channel.admin_checks == []  # no need to ask Telegram


async def test_cancel_by_a_chat_admin_is_accepted(bot: Bot) -> None:
    bot.channel.admin = True

    reply = await handle_command(bot, "/cancel all", sender_id=MEMBER)

    assert reply == "Crew: Cancelled 0 subagent run(s)."
    assert bot.runs.calls == [("cancel_chat", ALLOWED, "cancel all")]


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [(None, "No run nope in this chat."), (RunStatus.COMPLETED, "had already ended (completed)")],
)
async def test_cancel_outcomes_are_explained(bot: Bot, outcome: RunStatus | None, expected: str) -> None:
    bot.runs.cancel_outcome = outcome

    reply = await handle_command(bot, "/cancel nope", sender_id=ADMIN)

    assert expected in reply


@pytest.mark.parametrize("text", ["/cancel", "/cancel a b"])
async def test_cancel_with_wrong_arguments_gives_usage(bot: Bot, text: str) -> None:
    reply = await handle_command(bot, text, sender_id=ADMIN)

    assert reply == "Crew: Usage: /cancel <run id>, /cancel all, or /cancel all chat"
    assert bot.runs.calls == []


async def test_subagents_lists_runs(bot: Bot) -> None:
    now = time.time()
    bot.runs.runs = [
        RunSummary(id="run-b", label="build docs", status="running", created_at=now - 40, started_at=now - 30),
        RunSummary(id="run-a", label="echo hi", status="completed", created_at=now - 600, finished_at=now - 300),
        RunSummary(id="run-0", label="old", status="failed", created_at=now - 900),
    ]

    reply = await handle_command(bot, "/subagents")

    lines = reply.splitlines()
    assert lines[0] == "Crew: Subagent runs (newest first):"
    assert "`run-b`" in lines[1] and "running" in lines[1] and "for 30s" in lines[1] and "build docs" in lines[1]
    # A finished run shows when it ended, an age that no longer grows; without an end time, none.
    assert "`run-a`" in lines[2] and "completed" in lines[2] and "5m ago" in lines[2] and "10m" not in lines[2]
    assert "`run-0`" in lines[3] and "ago" not in lines[3] and "15m" not in lines[3]
    assert lines[4] == "/subagents <run id> shows what a run has printed so far."
    assert bot.runs.calls == [("list_runs", ALLOWED, MAX_LISTED_RUNS)]


async def test_subagents_with_a_run_id_needs_a_control_that_shows_output(bot: Bot) -> None:
    reply = await handle_command(bot, "/subagents run-a")

    assert reply == "Crew: Subagent output is not available here."


async def test_help_in_the_console_does_not_ask_for_mentions_and_names_quit(bot: Bot) -> None:
    reply = await handle_command(bot, "/help", chat_kind="console")

    assert "Mention me" not in reply
    assert "Every line you type is for me" in reply
    assert "/quit" in reply and "/subagents <run id>" in reply


async def test_subagents_with_no_runs(bot: Bot) -> None:
    assert await handle_command(bot, "/subagents") == "Crew: No subagent runs in this chat yet."


async def test_stop_with_no_turn_and_no_runs_says_nothing_to_stop(bot: Bot) -> None:
    reply = await handle_command(bot, "/stop", sender_id=ADMIN)

    assert reply == "Crew: Nothing to stop."


async def test_stop_with_no_turn_cancels_the_chats_runs(bot: Bot) -> None:
    bot.runs.chat_cancelled = 2

    reply = await handle_command(bot, "/stop", sender_id=ADMIN)

    assert reply == "Crew: Stopped 2 subagent run(s)."
    assert bot.runs.calls == [("cancel_chat", ALLOWED, "stop")]


async def test_stop_drops_the_messages_waiting_for_a_turn_slot(bot: Bot) -> None:
    busy = [-900 - k for k in range(bot.settings.max_concurrent_turns)]  # every slot taken by other chats
    for chat_id in busy:
        bot.engine.notify(chat_id)
    await bot.runner.wait_for(lambda: len(bot.runner.started) == len(busy))
    await bot.router.handle(inbound(ALLOWED, "@crew a question", platform_message_id=62, triggers=True))
    assert bot.engine.waiting(ALLOWED) and bot.engine.current_turn(ALLOWED) is None
    bot.runs.chat_cancelled = 2

    reply = await handle_command(bot, "/stop", sender_id=ADMIN, platform_message_id=63)

    assert reply == "Crew: Dropped the messages waiting for my answer. Stopped 2 subagent run(s)."
    bot.runner.finish(bot.runner.started[0])  # a slot frees: the dropped question never gets a turn
    await asyncio.wait_for(bot.typing.wait_idle(ALLOWED), WAIT_SECONDS)
    assert ALLOWED not in {turn.chat_id for turn in bot.runner.started}


async def test_stop_aborts_the_running_turn(bot: Bot) -> None:
    await bot.router.handle(inbound(ALLOWED, "@crew long question", platform_message_id=60, triggers=True))
    turn = await bot.runner.next_started(1)

    reply = await handle_command(bot, "/stop", sender_id=ADMIN, platform_message_id=61)

    assert reply == "Crew: Stopped my current answer and this chat's subagents."
    assert turn.aborted
    await bot.runner.wait_for(lambda: bot.runner.cancelled == [turn])


async def test_stop_by_a_non_admin_is_refused(bot: Bot) -> None:
    await bot.router.handle(inbound(ALLOWED, "@crew question", platform_message_id=70, triggers=True))
    turn = await bot.runner.next_started(1)

    reply = await handle_command(bot, "/stop", sender_id=MEMBER, platform_message_id=71)

    assert reply == "Crew: Only chat admins can use /stop."
    assert not turn.aborted
    bot.runner.finish(turn)


async def test_admin_check_failure_counts_as_not_admin(bot: Bot) -> None:
    async def failing(chat_id: int, user_id: int) -> bool:
        raise RuntimeError("Telegram unreachable")

    bot.channel.is_chat_admin = failing  # type: ignore[method-assign]

    reply = await handle_command(bot, "/cancel all", sender_id=MEMBER)

    assert reply == "Crew: Only chat admins can use /cancel."
    assert bot.runs.calls == []


async def test_private_chat_user_is_admin_of_their_chat(db: Database, chats: ChatStore, messages: MessageStore) -> None:
    private = 555
    settings = load_settings(_env_file=None, ALLOWED_CHAT_IDS=str(private))
    channel = RecordingChannel(admin=False)
    typing = TypingIndicator(channel.send_typing, 1.0)
    engine = ChatEngine(ControlledRunner(), RecordingLifecycle(), typing, 3.0)
    runs = FakeRunControl()
    delivery = make_delivery(db, channel, "Crew")
    commands = Commands(channel, delivery, engine, runs, [])
    router = InboundRouter(
        settings,
        chats=chats,
        messages=messages,
        engine=engine,
        commands=commands,
        delivery=delivery,
        flood=FloodGuard(),
    )
    try:
        await router.handle(
            inbound(
                private,
                "/cancel all",
                platform_message_id=1,
                sender_id=private,
                chat_kind="private",
                triggers=True,
                command="cancel",
                command_args=("all",),
            )
        )
        assert runs.calls == [("cancel_chat", private, "cancel all")]
    finally:
        await engine.close()
        await typing.close()


async def test_workspace_is_shown_to_everyone_and_cleared_only_by_admins(bot: Bot) -> None:
    replies: list[str] = []
    for number, (text, sender) in enumerate(
        [("/workspace", MEMBER), ("/workspace clear", MEMBER), ("/workspace clear", ADMIN)], start=60
    ):
        count = len(bot.channel.texts(ALLOWED))
        name, *args = text.removeprefix("/").split()
        message = inbound(
            ALLOWED, text, platform_message_id=number, sender_id=sender, triggers=True, command=name,
            command_args=tuple(args),
        )  # fmt: skip
        await bot.router.handle(message)
        await bot.channel.wait_for(lambda n=count: len(bot.channel.texts(ALLOWED)) > n)  # type: ignore[misc]
        replies.append(bot.channel.texts(ALLOWED)[-1])
    assert replies == [
        "Crew: uses 1.0 MB of 1024 MB",
        "Crew: Only chat admins can use /workspace.",
        "Crew: Cleared this chat's workspace.",
    ]
    assert bot.workspaces.calls == [("describe", ALLOWED), ("clear", ALLOWED)]
