"""Chat commands: /start, /help, /stop, /subagents, /cancel <run>|all, /budget, /memory, /forgetme, /web,
/tools. Control commands need an admin."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from bot.budget_command import BudgetCommand
from bot.channels.base import Channel
from bot.channels.inbound import InboundMessage
from bot.memory_command import MemoryCommand
from bot.ports.runs import RunCancels, RunInfo, when_text
from bot.schedules.book import TaskAction, TaskBook, TaskRequestError
from bot.tools_command import tools_reply
from bot.turns.engine import ChatEngine
from bot.web_command import WebCommand
from core.delivery import Delivery
from core.live_config import LiveConfig, parse_assignments
from core.logging import get_logger
from core.mcp_servers import McpServers
from core.settings import SettingsError
from core.store.runs import RunStatus

log = get_logger(__name__)

ADMIN_COMMANDS = frozenset({"stop", "cancel"})
KNOWN_COMMANDS = frozenset(
    {
        "start",
        "help",
        "stop",
        "cancel",
        "subagents",
        "workspace",
        "tasks",
        "timezone",
        "config",
        "budget",
        "memory",
        "forgetme",
        "web",
        "tools",
    }
)
MAX_LISTED_RUNS = 15
CONFIG_USAGE = "Usage: /config (show) or /config NAME=VALUE, e.g. /config MAX_CONCURRENT_SUBAGENTS=5"


class RunControl(RunCancels, Protocol):
    """The cancels, and the one listing of a chat's runs (from the store: bot/run_output.py's RunsView)."""

    async def list_runs(self, chat_id: int, limit: int) -> Sequence[RunInfo]: ...


class WorkspaceControl(Protocol):
    """The chat's workspace: what `/workspace` shows, and `/workspace clear` (admins) does."""

    async def describe(self, chat_id: int) -> str: ...

    async def clear(self, chat_id: int) -> str: ...


@runtime_checkable
class RunOutputSource(Protocol):
    """Optional beside RunControl: what a run printed so far, for `/subagents <run id>`."""

    async def run_output(self, chat_id: int, run_id: str) -> str | None:
        """The run's state and the tail of its output; None when the chat has no such run."""


HELP_TEXT = (
    "Mention me or reply to me to talk. For long or code-running work I start subagents.\n"
    "/subagents – this chat's subagent runs; /subagents <run id> – what one has printed so far\n"
    "/cancel <run id> or /cancel all – cancel runs (admins; in a forum topic, that topic's; "
    "/cancel all chat – every topic's)\n"
    "/stop – abort my current answer and stop all of this chat's subagents (admins)\n"
    "/workspace – the files this chat's subagents keep; /workspace clear – empty it (admins)\n"
    "/tasks – this chat's scheduled tasks; /tasks <id> – one's history; /tasks pause|resume|cancel <id>\n"
    "/timezone – the zone schedules are read in; /timezone Europe/Berlin sets it (admins)\n"
    "/budget – today's LLM use and allowance; /budget set <tokens>|default, /budget add <tokens> (admins)\n"
    "/memory – the chat's notes; /memory me – yours; /memory forget <id>; /memory off|on (admins); "
    "/forgetme – erase every note about you here\n"
    "/web – where subagents may go on the web; /web remove <host> – off this chat's own list (admins)\n"
    "/tools – the tools of the operator's MCP servers I can use here\n"
    "/config – the settings operators change live, /config NAME=VALUE to change one (ADMIN_USER_IDS)"
)
CONSOLE_HELP_TEXT = (
    "Every line you type is for me. For long or code-running work I start subagents.\n"
    "/subagents – this chat's subagent runs; /subagents <run id> – what one has printed so far\n"
    "/cancel <run id> or /cancel all – cancel runs\n"
    "/stop – abort my current answer and stop all subagents\n"
    "/workspace – the files subagents keep; /workspace clear – empty it\n"
    "/tasks – scheduled tasks; /tasks pause|resume|cancel <id>; /timezone [IANA name]\n"
    "/budget – today's LLM use and allowance; /budget set <tokens>|default, /budget add <tokens>\n"
    "/memory – the notes I keep; /memory forget <id>; /memory off|on; /forgetme\n"
    "/web – where subagents may go on the web; /web remove <host> – off this chat's own list\n"
    "/tools – the MCP tools I can use\n"
    "/config – the live settings; /config NAME=VALUE changes one (as `crewbot config set`)\n"
    "/answer <question id> <n> – answer a subagent's question (or an approval) with its option n\n"
    "/quit (or Ctrl-D, Ctrl-C) – leave; running subagents keep going and report at the next start"
)


class Commands:
    def __init__(
        self,
        channel: Channel,
        delivery: Delivery,
        engine: ChatEngine,
        runs: RunControl | None,
        admin_user_ids: list[int],
        *,
        workspaces: WorkspaceControl | None = None,
        tasks: TaskBook | None = None,
        conversations: Callable[[int], Awaitable[list[int]]] | None = None,
        config: LiveConfig | None = None,
        budget: BudgetCommand | None = None,
        memory: MemoryCommand | None = None,
        web: WebCommand | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self._channel = channel
        self._conversations = conversations  # a platform chat's conversations: itself and its forum topics
        self._delivery = delivery
        self._engine = engine
        self._runs = runs
        self._admin_user_ids = set(admin_user_ids)
        self._workspaces = workspaces
        self._tasks = tasks
        self._config = config
        self._budget = budget
        self._memory = memory
        self._web = web  # the chat's own web list (SUBAGENT_EGRESS=ask)
        self._mcp = mcp  # /tools: the chat's MCP tools

    def handles(self, command: str | None) -> bool:
        return command in KNOWN_COMMANDS

    async def _sees_operators(self, message: InboundMessage) -> bool:
        """The operator's settings (the web allowlist): ADMIN_USER_IDS, the console, a group's admins; never
        anyone just because the chat is private."""
        if message.sender_id in self._admin_user_ids or message.chat_kind == "console":
            return True
        return message.chat_kind != "private" and await self._is_admin(message)

    async def _is_admin(self, message: InboundMessage) -> bool:
        if message.sent_as_chat:
            return True  # an anonymous admin: Telegram lets only a group's admins speak as the group
        if message.sender_id is None:
            return False
        if message.sender_id in self._admin_user_ids or message.chat_kind in ("private", "console"):
            return True
        try:
            return await self._channel.is_chat_admin(message.chat_id, message.sender_id)
        except Exception as exc:
            log.warning("admin_check_failed", chat_id=message.chat_id, error=str(exc))
            return False

    async def _reply(self, message: InboundMessage, text: str) -> None:
        # Stored now, sent in the background: the update path never waits behind the chat's backlog.
        await self._delivery.notice(message.chat_id, text, wait=False, reply_to=message.platform_message_id)

    async def handle(self, message: InboundMessage) -> None:
        command = message.command or ""
        clearing = command == "workspace" and [a.lower() for a in message.command_args] == ["clear"]
        setting_zone = command == "timezone" and bool(message.command_args)
        if (command in ADMIN_COMMANDS or clearing or setting_zone) and not await self._is_admin(message):
            log.info("command_refused", command=command, user_id=message.sender_id)
            await self._reply(message, f"Only chat admins can use /{command}.")
            return
        if command in ("start", "help"):
            await self._reply(message, CONSOLE_HELP_TEXT if message.chat_kind == "console" else HELP_TEXT)
        elif command == "stop":
            await self._stop(message)
        elif command == "subagents" and message.command_args:
            await self._show(message, message.command_args[0].strip()[:64])
        elif command == "subagents":
            await self._list(message)
        elif command == "cancel":
            await self._cancel(message)
        elif command == "workspace":
            await self._workspace(message, clearing)
        elif command in ("tasks", "timezone"):
            await self._reply(message, await self._scheduled(message))
        elif command == "config":
            await self._configure(message)
        elif command == "tools":
            await self._reply(message, await tools_reply(self._mcp, message.chat_id))
        elif command == "budget":
            text = "Daily LLM allowances are not enabled here."
            if self._budget is not None:
                text = await self._budget.reply(
                    message.chat_id, message.command_args, message.sender_id, lambda: self._is_admin(message)
                )
            await self._reply(message, text)
        elif command in ("memory", "forgetme"):
            await self._remembered(message)
        elif command == "web":
            text = "Subagents are not enabled."
            if self._web is not None:
                text = await self._web.reply(
                    message.chat_id,
                    message.command_args,
                    lambda: self._is_admin(message),
                    lambda: self._sees_operators(message),
                )
            await self._reply(message, text)

    async def _remembered(self, message: InboundMessage) -> None:
        if self._memory is None:
            await self._reply(message, "Memory is not enabled here.")
            return
        reply = await self._memory.reply(message, lambda: self._is_admin(message))
        if reply.stored:
            await self._reply(message, reply.text)
        elif reply.private_to is not None:
            self._delivery.reply_unstored(reply.private_to, reply.text)
            await self._reply(message, "Sent you your notes in our private chat.")
        else:
            self._delivery.reply_unstored(message.chat_id, reply.text)

    async def _configure(self, message: InboundMessage) -> None:
        """Operators only: ADMIN_USER_IDS (read live from the settings) or the local console."""
        operator = message.chat_kind == "console" or (
            self._config is not None and message.sender_id in self._config.settings.admin_user_ids
        )
        if self._config is None or not operator:
            log.info("command_refused", command="config", user_id=message.sender_id)
            await self._reply(message, "Only the bot's operators (ADMIN_USER_IDS) can use /config.")
            return
        who = f"Telegram user {message.sender_id} in chat {message.platform_id}"
        await self._reply(message, await config_reply(self._config, message.command_args, who))

    async def _scheduled(self, message: InboundMessage) -> str:
        """/tasks [pause|resume|cancel <id>] and /timezone [zone]: the answer to send."""
        if self._tasks is None:
            return "Scheduled tasks are not enabled."
        chat_id, args = message.chat_id, message.command_args
        try:
            if message.command == "timezone":
                if not args:
                    return f"This chat's schedules are read in {(await self._tasks.zone(chat_id)).key}."
                return await self._tasks.set_timezone(chat_id, args[0])
            if not args:
                return await self._tasks.list_text(chat_id)
            if len(args) == 1 and args[0].lower() not in set(TaskAction):
                return await self._tasks.history_text(chat_id, args[0])
            if len(args) != 2 or args[0].lower() not in set(TaskAction):
                return "Usage: /tasks, /tasks <id>, or /tasks pause|resume|cancel <id>"
            # Anonymous admins and private chats need no lookup; the book asks the chat about anyone else.
            trusted = message.sent_as_chat or message.chat_kind in ("private", "console")
            return await self._tasks.change(chat_id, message.sender_id, args[1], TaskAction(args[0].lower()), trusted)
        except TaskRequestError as exc:
            return f"{str(exc)[:1].upper()}{str(exc)[1:]}."

    async def _stop(self, message: InboundMessage) -> None:
        chat_id = message.chat_id
        # Over MAX_CONCURRENT_TURNS a chat's messages wait for a turn slot with no turn yet: /stop drops them.
        queued = self._engine.current_turn(chat_id) is None and self._engine.waiting(chat_id)
        turn = self._engine.stop_turn(chat_id, by=message.sender_name)
        if turn is None:
            cancelled = await self._runs.cancel_chat(chat_id, "stop") if self._runs else 0
            done = ["Dropped the messages waiting for my answer."] if queued else []
            done += [f"Stopped {cancelled} subagent run(s)."] if cancelled else []
            text = " ".join(done) or "Nothing to stop."
        else:
            text = "Stopped my current answer and this chat's subagents."
        await self._reply(message, text)

    async def _list(self, message: InboundMessage) -> None:
        chat_id = message.chat_id
        if self._runs is None:
            await self._reply(message, "Subagents are not enabled.")
            return
        runs = await self._runs.list_runs(chat_id, MAX_LISTED_RUNS)
        if not runs:
            await self._reply(message, "No subagent runs in this chat yet.")
            return
        now = time.time()
        lines = [f"`{r.id}` {r.status:<11} {when_text(r, now):>9}  {r.label}" for r in runs]
        footer = "\n/subagents <run id> shows what a run has printed so far."
        await self._reply(message, "Subagent runs (newest first):\n" + "\n".join(lines) + footer)

    async def _show(self, message: InboundMessage, run_id: str) -> None:
        chat_id = message.chat_id
        if not isinstance(self._runs, RunOutputSource):
            await self._reply(message, "Subagent output is not available here.")
            return
        text = await self._runs.run_output(chat_id, run_id)
        if text is None:
            text = f"No run {run_id} in this chat. /subagents lists them."
        await self._reply(message, text)

    async def _workspace(self, message: InboundMessage, clearing: bool) -> None:
        chat_id = message.chat_id
        if self._workspaces is None:
            await self._reply(message, "Subagents are not enabled.")
            return
        text = await (self._workspaces.clear(chat_id) if clearing else self._workspaces.describe(chat_id))
        await self._reply(message, text)

    async def _cancel(self, message: InboundMessage) -> None:
        chat_id, args = message.chat_id, message.command_args
        if self._runs is None:
            await self._reply(message, "Subagents are not enabled.")
            return
        lowered = [a.strip().lower() for a in args]
        if lowered == ["all", "chat"]:  # explicit: every topic of a forum, not only the one it is sent in
            targets = await self._conversations(message.platform_id) if self._conversations else [chat_id]
            count = sum([await self._runs.cancel_chat(target, "cancel all chat") for target in targets or [chat_id]])
            await self._reply(message, f"Cancelled {count} subagent run(s) in the whole chat.")
            return
        if len(args) != 1:
            await self._reply(message, "Usage: /cancel <run id>, /cancel all, or /cancel all chat")
            return
        target = args[0].strip()
        if target.lower() == "all":
            count = await self._runs.cancel_chat(chat_id, "cancel all")
            await self._reply(message, f"Cancelled {count} subagent run(s).")
            return
        outcome = await self._runs.cancel_run(chat_id, target[:64])
        if outcome is None:
            text = f"No run {target[:64]} in this chat. /subagents lists them."
        elif outcome is RunStatus.CANCELLED:
            text = f"Cancelled run {target}."
        else:
            text = f"Run {target} had already ended ({outcome})."
        await self._reply(message, text)


async def config_reply(config: LiveConfig, args: tuple[str, ...], changed_by: str) -> str:
    """`/config`: the live-changeable settings; `/config NAME=VALUE` changes one, through the same validation,
    persistence and log as `crewbot config set`; the reply is the start-up error line when it is refused. Only
    for operators (ADMIN_USER_IDS, and the console): a chat admin runs one group, a cap is for the whole host."""
    if not args:
        rows = [r for r in await config.effective() if r.live]
        lines = [f"{r.name} = {r.value} ({r.source.value})" for r in rows]
        return "Live settings (change with /config NAME=VALUE; from the next run's start):\n" + "\n".join(lines)
    try:
        changes = parse_assignments(args)
    except ValueError as exc:
        return f"{exc}\n{CONFIG_USAGE}"
    replies: list[str] = []
    for name, value in changes.items():
        try:
            change = await config.set(name, value, changed_by)
        except SettingsError as exc:
            replies.extend(exc.lines)
            break
        replies.append(f"{change.name}: {change.old_value} -> {change.new_value} (from the next run's start)")
    return "\n".join(replies)
