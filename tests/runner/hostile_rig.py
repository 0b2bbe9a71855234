"""A running crewbot for hostile-subagent tests: real app, real SQLite, real engine and image, fakes at the edge.

The subagents' LLM is FakeLLM behind the host's proxy, answering by the offline model's rules (each `$ ` line of
the task is run through the bash tool), at a few tokens a call, with three twists a task can ask for:

- `hold: KEY`: the run's final answer waits until the test calls `release(KEY)`, so the test can act while the
  container is alive and its attacks are done;
- `spend: N`: every call of the run reports N input tokens;
- `answer chars: N`: the final answer is N characters long.

Attacks run as Python inside the container (`container_python`), speaking raw HTTP to the run socket. Every
check a hostile test owes (host files unchanged, no secret for the chat's next run, the bot answering another
chat, one outcome per run, budgets kept) is a method of `World`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import stat
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container.protocol import MAX_PROGRESS_CHARS, SpawnRequest
from core.settings import Settings
from core.store.chats import Chat
from core.store.messages import MessageStore
from core.store.runs import RunRecord, RunStatus, RunStore
from crewbot.app import App
from runner.ipc import ensure_chat_dirs, write_spawn_request
from runner.offline_subagent import OfflineRequestError, OfflineSubagentModel, message_text
from runner.outcome import MAX_RESULT_CHARS
from runner.service import SubagentService
from tests.fakes.llm_server import FakeLLM, RecordedRequest
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

LLM_KEY = "sk-llm-provider-key-7f3a9c"  # the provider key: only the proxy may hold it
# The operator's secret in a `.env` beside DATA_DIR. Kept in two halves so that no task, command or script a
# test sends ever contains it whole: finding it anywhere a run can see means the host leaked it.
SECRET_HALVES = ("ENV-SECRET-", "b81f2c6d0e")
SECRET = "".join(SECRET_HALVES)
KEY_HALVES = (LLM_KEY[:7], LLM_KEY[7:])

SUBAGENT_MODEL = "pinned-subagent-model"
MAX_MESSAGES = 3  # SUBAGENT_MAX_MESSAGES
MAX_TOKENS = 1_000  # SUBAGENT_MAX_TOKENS, the lowest the settings allow
QUOTA_MB = 2  # WORKSPACE_QUOTA_MB
TOKENS_PER_CALL = 10  # what an ordinary call reports: far below the budget, however many a run makes
BYSTANDER = GROUP_ID - 900  # the chat that must keep getting answers
RUN_WAIT_SECONDS = 90.0  # container start-up is slow on a loaded 2-core machine
ANSWER_SECONDS = 15.0  # generous on purpose: it fails only if a hostile run blocks the bot
POLL_SECONDS = 0.1
TELEGRAM_PART_CHARS = 4_096
MAX_PARTS_PER_OUTCOME = -(-(MAX_RESULT_CHARS + 200) // TELEGRAM_PART_CHARS)  # a cut result and its heading

LONG_ANSWER_LINE = "a long answer, line after line\n"

_HOLD = re.compile(r"^hold: (\S+)$", re.M)
_SPEND = re.compile(r"^spend: (\d+)$", re.M)
_ANSWER_CHARS = re.compile(r"^answer chars: (\d+)$", re.M)
_REPORT = re.compile(r"^(\w+)=(.*)$", re.M)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def last_task(body: Any) -> str:
    """The text of the last user message: a run's task, as the offline model reads it."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return ""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return message_text(users[-1]) if users else ""


class SubagentLLM:
    """The FakeLLM handler; see the module docstring."""

    def __init__(self) -> None:
        self._offline = OfflineSubagentModel()
        self._gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._held: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        task = last_task(body)
        try:
            completion = self._offline.complete(body)
        except OfflineRequestError:
            completion = self._offline.complete({"messages": [{"role": "user", "content": "(no task)"}]})
        spend = _SPEND.search(task)
        tokens = int(spend.group(1)) if spend else TOKENS_PER_CALL
        completion["usage"] = {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
        choice = completion["choices"][0]
        if choice["finish_reason"] == "stop":
            chars = _ANSWER_CHARS.search(task)
            if chars:
                size = int(chars.group(1))
                choice["message"]["content"] = (LONG_ANSWER_LINE * (size // len(LONG_ANSWER_LINE) + 1))[:size]
            hold = _HOLD.search(task)
            if hold:
                self._held[hold.group(1)].set()
                await self._gates[hold.group(1)].wait()
        return completion

    async def wait_held(self, key: str) -> None:
        """Until the run with `hold: key` has done its commands and asks for its final answer."""
        async with asyncio.timeout(RUN_WAIT_SECONDS):
            await self._held[key].wait()

    def release(self, key: str) -> None:
        self._gates[key].set()

    def release_all(self) -> None:
        for gate in list(self._gates.values()):
            gate.set()


# --- code the attacker runs in the container ------------------------------------------------------------

PRELUDE = r"""
import http.client, json, os, socket, stat, sys

SOCKET = "/crewbot/channel/run.sock"


# (status, body) of one request on the run socket; status 0 when the host hung up instead of answering.
# Head and body go out in one write: the host answers a request it refuses without reading the body, and
# hangs up, so a body sent after the head could meet a closed socket instead of the answer.
def call(method, path, body=None, headers=None):
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Host": "run", "Content-Type": "application/json", "Content-Length": str(len(data)),
            "Connection": "close", **(headers or {})}
    lines = [method + " " + path + " HTTP/1.1"] + [name + ": " + value for name, value in head.items()]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        sock.connect(SOCKET)
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()
    except OSError as exc:
        return 0, repr(exc).encode()
    finally:
        sock.close()


def report(name, value):
    print(name + "=" + json.dumps(value, sort_keys=True), flush=True)
"""


def container_python(source: str, **args: Any) -> str:
    """A `$ ` line that runs `source` (after PRELUDE, with `ARGS` set) with the image's python3."""
    program = f"{PRELUDE}\nARGS = json.loads({json.dumps(json.dumps(args))})\n{source}"
    encoded = base64.b64encode(program.encode()).decode()
    return f"$ python3 -c \"import base64; exec(base64.b64decode('{encoded}'))\""


def reports(text: str | None) -> dict[str, Any]:
    """What the container's scripts `report`ed, from a run's result (the offline model quotes the output)."""
    return {name: json.loads(value) for name, value in _REPORT.findall(text or "")}


# The chat's next run looks everywhere it can for the secret and the provider key: its files, its environment
# and its task (which carries the chat's session).
PROBE = r"""
needles = [a + b for a, b in ARGS["halves"]]
hits = []
for top in ("/workspace", "/tmp", "/crewbot"):
    for root, _dirs, files in os.walk(top):  # never follows a link
        for name in files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size < 8 << 20:  # not the planted sparse giants
                with open(path, "rb") as handle:
                    data = handle.read()
                hits += [path for needle in needles if needle.encode() in data]
status, task = call("GET", "/run/task")
report("probe", {
    "file_hits": len(hits),
    "env_hits": sum(needle in value for needle in needles for value in os.environ.values()),
    "task_status": status,
    "task_hits": sum(needle.encode() in task for needle in needles),
})
"""


# --- host files that must not change --------------------------------------------------------------------


@dataclass(frozen=True)
class FileState:
    data: bytes
    mtime_ns: int
    mode: int
    nlink: int


def file_state(path: Path) -> FileState:
    st = path.lstat()
    return FileState(path.read_bytes(), st.st_mtime_ns, st.st_mode, st.st_nlink)


def plant_canaries(root: Path, data_dir: Path) -> dict[Path, FileState]:
    """A fake `.env` with the secret beside DATA_DIR and canaries inside it, dated in the past so that any
    rewrite shows as a new mtime."""
    files = {
        root / ".env": f"LLM_API_KEY={LLM_KEY}\nOPERATOR_SECRET={SECRET}\n",
        data_dir / "canary.txt": "canary in DATA_DIR\n",
        data_dir / "runs" / "canary-run" / "task.json": '{"canary": true}\n',
        data_dir / "sessions" / "canary.json": "[]\n",
    }
    long_ago = time.time() - 86_400
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)
        os.utime(path, (long_ago, long_ago))
    return {path: file_state(path) for path in files}


def odd_host_entries(data_dir: Path) -> list[str]:
    """Everything under DATA_DIR, outside the workspaces, that is not a plain directory or a regular file with
    one link: what a host that copied or followed a container's entry would leave behind."""
    odd: list[str] = []
    for root, dirs, files in os.walk(data_dir):
        if Path(root) == data_dir:
            dirs.remove("workspaces")
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(root, name))
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                odd.append(f"{os.path.join(root, name)} mode={oct(st.st_mode)} links={st.st_nlink}")
    return odd


# --- the world --------------------------------------------------------------------------------------------


@dataclass
class World:
    settings: Settings
    tg: FakeTelegram
    llm: FakeLLM
    script: SubagentLLM
    app: App
    canaries: dict[Path, FileState]

    @property
    def service(self) -> SubagentService:
        assert isinstance(self.app.subagents, SubagentService)
        return self.app.subagents

    @property
    def runs(self) -> RunStore:
        return RunStore(self.app.stores.db)

    @property
    def messages(self) -> MessageStore:
        return MessageStore(self.app.stores.db)

    @property
    def ipc_root(self) -> Path:
        return self.settings.data_dir / "ipc"

    def workspace(self, chat: Chat) -> Path:
        return self.settings.data_dir / "workspaces" / chat.folder

    async def chat(self, chat_id: int) -> Chat:
        chat = await self.app.stores.chats.ensure(chat_id, "supergroup", f"hostile {chat_id}")
        await asyncio.to_thread(ensure_chat_dirs, self.ipc_root, chat.folder)
        self.tg.add_chat(chat_id, title=f"hostile {chat_id}")
        return chat

    async def spawn(self, chat: Chat, task: str, label: str, *, run_id: str | None = None) -> str:
        """As the main agent would: a spawn request in the chat's IPC folder. Returns the run id."""
        run_id = run_id or new_id(label)
        request = SpawnRequest(request_id=run_id, task=task, label=label)
        await asyncio.to_thread(write_spawn_request, self.ipc_root, chat.folder, request)
        return run_id

    async def record(self, run_id: str) -> RunRecord | None:
        return await self.runs.get(run_id)

    async def wait_status(self, run_id: str, *statuses: str) -> RunRecord:
        async with asyncio.timeout(RUN_WAIT_SECONDS):
            while True:
                record = await self.runs.get(run_id)
                if record is not None and record.status in statuses:
                    return record
                await asyncio.sleep(POLL_SECONDS)

    async def wait_final(self, run_id: str) -> RunRecord:
        """The run's outcome, once the run is over on the host too: channel closed, container removed."""
        live = self.service.live
        async with asyncio.timeout(RUN_WAIT_SECONDS):
            while True:
                record = await self.runs.get(run_id)
                if (
                    record is not None
                    and record.status not in (RunStatus.QUEUED, RunStatus.RUNNING)
                    and run_id not in live
                ):
                    return record
                await asyncio.sleep(POLL_SECONDS)

    def calls_of(self, marker: str) -> list[RecordedRequest]:
        """The requests that reached FakeLLM for the run whose task holds `marker`."""
        return [r for r in self.llm.requests("/v1/chat/completions") if marker in last_task(r.body)]

    def tool_reports(self, marker: str) -> dict[str, Any]:
        """What the run's commands `report`ed, as the run's last LLM call carried it back (for a run whose
        result is something else: a result it posted itself, or none)."""
        calls = self.calls_of(marker)
        if not calls:
            return {}
        messages = calls[-1].body["messages"]
        task_index = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        return reports("\n".join(message_text(m) for m in messages[task_index:] if m.get("role") == "tool"))

    # --- the checks every attack owes ---------------------------------------------------------------------

    async def bystander_answers(self, *, while_running: str | None = None) -> None:
        """Another allowed chat's /help is answered now; with `while_running`, before that run has ended."""
        before = len(self.tg.sent_messages(BYSTANDER))
        self.tg.push_message(BYSTANDER, "/help")
        await self.tg.wait_for_messages(BYSTANDER, before + 1, timeout_seconds=ANSWER_SECONDS)
        if while_running is not None:
            record = await self.runs.get(while_running)
            assert record is not None and record.status == RunStatus.RUNNING, record

    async def assert_one_outcome(self, chat: Chat, record: RunRecord) -> str:
        """The run's outcome is one stored [Subagent] message, sent once; returns its stored text."""
        heading = f"[Task: {record.label}]\n"
        await self.tg.wait_until(
            lambda: next((m for m in self.tg.sent_messages(chat.id) if heading in m.plain_text), None),
            timeout_seconds=ANSWER_SECONDS,
        )
        stored = [m for m in await self.messages.recent(chat.id, 500) if m.kind == "subagent"]
        mine = [m for m in stored if m.content.startswith(heading)]
        assert len(mine) == 1, [m.content[:100] for m in mine]
        assert mine[0].sender_name == "[Subagent]" and mine[0].is_bot
        sent = [m for m in self.tg.sent_messages(chat.id) if m.plain_text.startswith(f"Crew: {heading}")]
        assert len(sent) == 1, [m.plain_text[:100] for m in sent]
        return mine[0].content

    async def assert_within_budgets(self, chat: Chat) -> None:
        """Every run of the chat kept SUBAGENT_MAX_MESSAGES, and the chat got no more than those messages and
        one (cut) outcome per run, each under Telegram's limit."""
        records = await self.runs.for_chat(chat.id, 100)
        assert all(r.messages_sent <= MAX_MESSAGES for r in records), [(r.id, r.messages_sent) for r in records]
        stored = await self.messages.recent(chat.id, 1_000)
        progress = [m for m in stored if m.kind == "progress"]
        assert len(progress) <= MAX_MESSAGES * len(records)
        sent = self.tg.sent_messages(chat.id)
        assert len(sent) <= len(records) * (MAX_MESSAGES + MAX_PARTS_PER_OUTCOME), len(sent)
        assert all(len(m.plain_text) <= TELEGRAM_PART_CHARS for m in sent)
        most_chars = len(records) * (MAX_MESSAGES * (MAX_PROGRESS_CHARS + 10) + MAX_RESULT_CHARS + 300)
        assert sum(len(m.plain_text) for m in sent) <= most_chars

    async def assert_no_secret_for_next_run(self, chat: Chat) -> None:
        """The chat's next run can find neither the operator's secret nor the provider key anywhere it looks."""
        marker = new_id("probe")
        task = f"{marker}\n{container_python(PROBE, halves=[SECRET_HALVES, KEY_HALVES])}"
        record = await self.wait_final(await self.spawn(chat, task, "probe"))
        assert record.status == "completed", record.error  # it started fine in the workspace the attack left
        found = reports(record.result)["probe"]
        assert found == {"file_hits": 0, "env_hits": 0, "task_status": 200, "task_hits": 0}, found
        outcome = await self.assert_one_outcome(chat, record)
        calls = self.calls_of(marker)
        assert calls, "the probe never reached the LLM"
        for text in (outcome, record.result or "", *(r.raw_body.decode() for r in calls)):
            assert SECRET not in text and LLM_KEY not in text

    def assert_host_untouched(self) -> None:
        for path, before in self.canaries.items():
            assert file_state(path) == before, f"{path} changed"
        odd = odd_host_entries(self.settings.data_dir)
        assert odd == [], odd


def hostile_settings(tmp_dir: Path, tg: FakeTelegram, llm: FakeLLM, chat_ids: list[int]) -> Settings:
    return make_settings(
        tmp_dir / "data",
        tg,
        ALLOWED_CHAT_IDS=",".join(str(c) for c in [*chat_ids, BYSTANDER]),
        LLM_PROVIDER="openai",
        LLM_BASE_URL=llm.base_url,
        LLM_API_KEY=LLM_KEY,
        LLM_MODEL="main-model",
        SUBAGENT_MODEL=SUBAGENT_MODEL,
        SUBAGENT_MAX_MESSAGES=MAX_MESSAGES,
        SUBAGENT_MAX_TOKENS=MAX_TOKENS,
        WORKSPACE_QUOTA_MB=QUOTA_MB,
        SUBAGENT_TIMEOUT_SECONDS=120,
        IPC_RESCAN_SECONDS=0.5,  # a stray spawn request anywhere the watcher looks would be found at once
        TYPING_INTERVAL_SECONDS=1.0,
    )


@asynccontextmanager
async def hostile_world(tmp_dir: Path, chat_ids: list[int]) -> AsyncIterator[World]:
    """One running bot for a module's attacks; each attack uses its own chat of `chat_ids`."""
    script = SubagentLLM()
    async with FakeTelegram() as tg, FakeLLM(api_key=LLM_KEY) as llm:
        llm.openai.handle_with(script)
        settings = hostile_settings(tmp_dir, tg, llm, chat_ids)
        canaries = plant_canaries(tmp_dir, settings.data_dir)
        async with telegram_app(settings, with_subagents=True) as app:
            world = World(settings, tg, llm, script, app, canaries)
            try:
                yield world
            finally:
                script.release_all()  # a failed test must not leave a run waiting for ever
        world.assert_host_untouched()
