"""Opening a run's channel: its task (context, prior session, the chat files it is given), its host-side
folders, its endpoint on the channel (runner/channel/run_endpoint.py) and the socket it listens on.

A new run's channel is prepared, then served once its run is marked running (`prepare`, then `serve`): a claimed
warm pool member's agent is answered its task the moment the channel serves, so it never sends a model request
for a run still recorded queued, and a run recorded queued never had its task (restart recovery relies on it)."""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from container.protocol import CHANNEL_SOCKET_FILE, TaskSpec
from core.delivery import Delivery
from core.mcp_config import Use
from core.mcp_servers import McpServers
from core.settings import Settings
from core.store.chats import Chat
from core.store.runs import RunRecord, RunStatus
from runner.channel.llm_allowance import Payer
from runner.channel.llm_proxy import Spent
from runner.channel.mcp_desk import McpLimits, RunMcpDesk, offered_specs
from runner.channel.run_endpoint import RunInbox
from runner.channel.run_file_desk import FilesOut, RunFileDesk
from runner.channel.run_questions import RunAsking
from runner.lifecycle.manager_ports import RunChannels, RunStores
from runner.lifecycle.run_accounting import RunAccounting
from runner.lifecycle.run_doors import RunDoors
from runner.runs.live_runs import LiveRun
from runner.storage.paths import DataPaths
from runner.storage.run_files import RunFiles
from runner.storage.run_inputs import BYTES_PER_MB, RunInputsBuilder
from runner.storage.workspaces import Workspaces

McpDeskFactory = Callable[[Callable[[], None], Callable[[int, str], None]], RunMcpDesk]  # liveness, invalid count
CONTEXT_MESSAGES = 20  # recent chat lines handed to a subagent with include_context=True


@dataclass(frozen=True, slots=True)
class Prepared:
    """A run's channel, ready to serve: its socket, its endpoint, what it spent so far and who pays its calls."""

    run_id: str
    socket_path: Path
    endpoint: RunInbox
    spent: Spent
    payer: Payer
    listening: socket.socket | None


class RunOpener:
    def __init__(
        self,
        settings: Settings,
        *,
        stores: RunStores,
        channels: RunChannels,
        delivery: Delivery,
        paths: DataPaths,
        files: RunFiles,
        inputs: RunInputsBuilder,
        doors: RunDoors,
        accounting: RunAccounting,
        workspaces: Workspaces,
        mcp: McpServers | None = None,
    ) -> None:
        self._settings = settings
        self._runs = stores.runs
        self._messages = stores.messages
        self._run_files = stores.files
        self._questions = stores.questions
        self._channels = channels
        self._delivery = delivery
        self._paths = paths
        self._files = files
        self._inputs = inputs
        self._doors = doors
        self._accounting = accounting  # the files given and sent, in the metrics
        self._workspaces = workspaces  # the chat's archive, where the workspace travels over the channel
        self._mcp = mcp  # the operator's MCP servers: the tools offered to subagents, called by the host

    async def open(
        self, live: LiveRun, chat: Chat, task: str, include_context: bool, record: RunRecord, files: tuple[str, ...]
    ) -> None:
        """A re-attached run's channel, prepared and served at once (its record says `running` already)."""
        await self.serve(await self.prepare(live, chat, task, include_context, record, files))

    async def serve(self, prepared: Prepared) -> None:
        """The run's socket listens (or a claimed member's is served): its agent gets its task from here on."""
        await self._channels.open_run(
            prepared.run_id,
            prepared.socket_path,
            endpoint=prepared.endpoint,
            spent=prepared.spent,
            payer=prepared.payer,
            listening=prepared.listening,
        )

    async def prepare(
        self,
        live: LiveRun,
        chat: Chat,
        task: str,
        include_context: bool,
        record: RunRecord | None,
        files: tuple[str, ...],
        *,
        listening: socket.socket | None = None,
    ) -> Prepared:
        """Everything but serving: `listening` is a claimed warm pool member's run socket, bound in the folder now
        the run's. The run's placement is decided before (RunContainers.place): only a synced run is served the
        chat's archive."""
        context: list[str] = []
        if include_context:
            recent = await self._messages.recent(live.chat_id, CONTEXT_MESSAGES)
            context = [f"{m.sender_name}: {m.content}" for m in recent]
        session_in = record.session_in if record is not None and record.session_in else None
        starting = record is None or record.status == RunStatus.QUEUED  # else re-attached after a restart
        if starting:
            session_in = await self._runs.session_for(live.chat_id, live.turn_id)  # a reply continues its run
        inputs = await self._inputs.build(live.chat_id, files, live.id)
        if inputs.given or not starting:  # a new run given nothing has nothing recorded to replace: no write
            await self._run_files.set_given(live.id, live.chat_id, inputs.given)
        if starting:
            self._accounting.files_given(inputs.given)
        spec = await self._files.prepare(live, chat, task, context, session_in, inputs)
        # The door listens beside the run socket (its folder exists now); the task says what it may reach.
        egress = await self._doors.open(live.id, live.chat_id, self._paths.channel_dir(live.id))
        if egress is not None:
            spec = spec.model_copy(update={"egress": egress})
        spec, mcp_desk = await self._mcp_tools(live, spec)
        socket_path = self._paths.channel_dir(live.id) / CHANNEL_SOCKET_FILE
        out = FilesOut(
            out_dir=self._paths.run_files_out(live.id),
            store=self._run_files,
            max_files=spec.max_files_out,
            max_file_bytes=spec.max_file_bytes,
        )
        desk = RunFileDesk(
            live,
            offered=inputs.paths,
            out=out,
            runs=self._runs,
            delivery=self._delivery,
            on_sent=self._accounting.file_sent,
        )
        live.inbox = RunInbox(
            live,
            spec,
            socket_path=socket_path,
            runs=self._runs,
            delivery=self._delivery,
            max_messages=self._settings.subagent_max_messages,
            session_max_messages=self._settings.subagent_session_max_messages,
            files=desk,
            workspace=self._workspaces.served(live.id, chat.folder),
            asking=self._asking(live),
            mcp=mcp_desk,
        )
        live.inbox.session_in = session_in if spec.history else None
        spent = Spent(record.input_tokens + record.output_tokens, record.llm_requests) if record else Spent()
        # Its calls spend its chat's daily allowance, as a scheduled task's work or a turn's (a re-attached run too).
        payer = Payer.of_run(live.chat_id, live.turn_id)
        return Prepared(live.id, socket_path, live.inbox, spent, payer, listening)

    def _asking(self, live: LiveRun) -> RunAsking | None:
        """ask_chat's end on the host, when this process has a chat to ask."""
        if self._questions is None:
            return None
        s = self._settings

        def invalid(status: int, reason: str) -> None:
            if isinstance(live.inbox, RunInbox):
                live.inbox.invalid(status, reason)

        return RunAsking(
            live,
            self._questions,
            reply_to=lambda: self._runs.asked_by(live.id),
            timeout_seconds=lambda: s.subagent_ask_timeout_seconds,
            max_questions=lambda: s.subagent_max_questions,
            invalid=invalid,
        )

    async def _mcp_tools(self, live: LiveRun, spec: TaskSpec) -> tuple[TaskSpec, McpDeskFactory | None]:
        """The chat's MCP tools for subagents, as the file says now: named in the task, called by the host."""
        if self._mcp is None:
            return spec, None
        offered = (await self._mcp.tools_for(live.chat_id, Use.SUBAGENTS)).tools
        specs = offered_specs(offered, self._settings.subagent_mcp_max_calls)
        if not specs:
            return spec, None
        names = {s.name for s in specs}
        s = self._settings
        limits = McpLimits(s.subagent_mcp_max_calls, int(s.subagent_mcp_max_result_mb * BYTES_PER_MB))
        by_name = {tool.name: tool for tool in offered if tool.name in names}
        desk = functools.partial(RunMcpDesk, live.id, live.chat_id, self._mcp, by_name, limits)
        return spec.model_copy(update={"mcp_tools": specs}), desk
