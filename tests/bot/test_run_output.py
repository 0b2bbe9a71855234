"""`/subagents <run id>`: a running subagent's output so far from its container, a finished one's from the log
the host kept; the tail only, cleaned of terminal control; only the chat's own runs. Real store, in-memory engine."""

from __future__ import annotations

from pathlib import Path

from bot.commands import Commands
from bot.run_output import CHAT_OUTPUT_TAIL_CHARS, MAX_LISTED_FILES, RunOutputReader, RunsView
from bot.turns.engine import ChatEngine
from core.store.chat_files import FileKind
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.egress import EgressStore
from core.store.outbox import SentFileKind
from core.store.run_files import RunFileStore
from core.store.runs import RunStatus, RunStore
from runner.runtimes.runtime import ContainerSpec
from tests.bot.helpers import FakeRunControl, RecordingChannel, make_delivery
from tests.egress_helpers import allowed, record, refused
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.run_files_helpers import give, send

CHAT, OTHER_CHAT = -100, -200


def spec(name: str) -> ContainerSpec:
    return ContainerSpec(name=name, image="img", command=[], labels={}, mounts=[], user="1000:1000")


async def never_exits(container: MemoryContainer) -> int | None:
    return None


class Runs:
    def __init__(self, db: Database, runtime: MemoryRuntime, runs_dir: Path) -> None:
        self.store = RunStore(db)
        self.chats = ChatStore(db)
        self.runtime = runtime
        self.runs_dir = runs_dir
        reader = RunOutputReader(
            self.store,
            runtime,
            lambda run_id: runs_dir / run_id / "log",
            files=RunFileStore(db),
            egress=EgressStore(db),
        )
        self.view = RunsView(FakeRunControl(), self.store, reader)

    async def queued(self, run_id: str, chat_id: int = CHAT) -> None:
        await self.chats.ensure(chat_id, "group", "g")
        await self.store.create(
            run_id, chat_id=chat_id, turn_id=None, task="$ make", label="make", include_context=False,
            status=RunStatus.QUEUED,
        )  # fmt: skip

    async def running(self, run_id: str, chat_id: int = CHAT, logs: bytes = b"") -> str:
        await self.queued(run_id, chat_id)
        await self.store.mark_running(run_id, None)
        container_id = await self.runtime.start(spec(f"c-{run_id}"))
        self.runtime.container(container_id).logs = logs
        await self.store.set_container(run_id, container_id)
        return container_id

    async def finished(self, run_id: str, kept: bytes | None) -> None:
        await self.running(run_id)
        await self.store.finish(run_id, RunStatus.COMPLETED, result="done")
        if kept is not None:
            (self.runs_dir / run_id).mkdir(parents=True)
            (self.runs_dir / run_id / "log").write_bytes(kept)


async def test_a_running_runs_output_so_far_comes_from_its_container(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-a", logs=b"compiling...\nstep 2 of 3\n")

        text = await runs.view.run_output(CHAT, "run-a")

    assert text is not None
    assert text.startswith("Run run-a (make): running for ")
    assert "Output so far:\n```\ncompiling...\nstep 2 of 3\n```" in text


async def test_only_the_tail_is_shown_and_terminal_control_is_removed(db: Database, tmp_path: Path) -> None:
    hostile = b"\x1b]0;owned\x07\x1b[2J" + b"x" * 10_000 + b"\x1b[31mlast line\x1b[0m ```"
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-a", logs=hostile)

        text = await runs.view.run_output(CHAT, "run-a")

    assert text is not None
    assert f"(the last {CHAT_OUTPUT_TAIL_CHARS:,} characters)" in text
    assert "\x1b" not in text and "\x07" not in text
    assert text.endswith("last line '''\n```")  # the output cannot close the code block early
    assert len(text) < CHAT_OUTPUT_TAIL_CHARS + 200


async def test_a_finished_runs_output_is_the_log_the_host_kept(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.finished("run-a", kept=b"all done\n")

        text = await runs.view.run_output(CHAT, "run-a")

    assert text is not None
    assert text.startswith("Run run-a (make): completed, 0s ago. Its output:")
    assert "all done" in text


async def test_another_chats_run_does_not_exist_here(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-b", chat_id=OTHER_CHAT, logs=b"secret of the other chat")

        assert await runs.view.run_output(CHAT, "run-b") is None
        assert await runs.view.run_output(CHAT, "no-such-run") is None


async def test_an_engine_outage_is_said_not_raised(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-a", logs=b"x")
        runtime.set_engine_down(True)

        text = await runs.view.run_output(CHAT, "run-a")

    assert text is not None and "No output to show: its container's output cannot be read" in text


async def test_a_queued_run_has_no_output_yet(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime() as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.queued("run-q")

        text = await runs.view.run_output(CHAT, "run-q")

    assert text == "Run run-q (make): queued for 0s. No output to show: it has no container yet."


async def test_the_list_shows_when_finished_runs_ended(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.finished("run-a", kept=None)
        await runs.running("run-b")

        [newest, oldest] = await runs.view.list_runs(CHAT, 10)

    assert (newest.id, newest.finished_at) == ("run-b", None)
    assert oldest.id == "run-a" and oldest.finished_at is not None and oldest.started_at is not None


async def test_subagents_with_an_id_answers_in_the_chat(db: Database, tmp_path: Path) -> None:
    from bot.channels.inbound import InboundMessage
    from core.typing_indicator import TypingIndicator

    channel = RecordingChannel()
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-a", logs=b"halfway there\n")
        typing = TypingIndicator(channel.send_typing, 1.0)
        engine = ChatEngine(lambda turn: _noop(), _NoLifecycle(), typing, 0.0)
        commands = Commands(channel, make_delivery(db, channel), engine, runs.view, [])

        for args in (("run-a",), ("nope",)):
            await commands.handle(
                InboundMessage(CHAT, "group", "g", 1, "Alice", "/subagents", command="subagents", command_args=args)
            )
        await channel.wait_for(lambda: len(channel.sent) == 2)

    assert "halfway there" in channel.sent[0][1]
    assert channel.sent[1][1] == "Crew: No run nope in this chat. /subagents lists them."


async def test_the_files_a_run_was_given_and_sent_are_listed(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-a", logs=b"plotting\n")
        await give(db, "run-a", CHAT, [("sales.csv", 412 * 1024, FileKind.DOCUMENT), ("logo.jpg", 900, FileKind.PHOTO)])
        await send(db, "run-a", CHAT, "chart.png", 34 * 1024, SentFileKind.PHOTO, tmp_path / "out" / "001-1")
        await send(db, "run-a", CHAT, "report.pdf", 3 * 1024 * 1024, SentFileKind.DOCUMENT, tmp_path / "out" / "002-2")

        text = await runs.view.run_output(CHAT, "run-a")

    assert text is not None
    heading, files_in, files_out, output = text.split("\n", 3)
    assert heading.startswith("Run run-a (make): running for ")
    assert files_in == "Files in: sales.csv (412 KB), logo.jpg (900 bytes)"
    assert files_out == "Files out: chart.png (34 KB, photo), report.pdf (3.0 MB, document)"
    assert output == "Output so far:\n```\nplotting\n```"


async def test_only_the_directions_a_run_has_are_listed_and_long_lists_are_cut(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.queued("run-q")
        many = [(f"part`{n}.csv", 10, FileKind.DOCUMENT) for n in range(MAX_LISTED_FILES + 3)]
        await give(db, "run-q", CHAT, many)

        text = await runs.view.run_output(CHAT, "run-q")

    assert text is not None
    heading, files_in, said = text.split("\n")
    assert heading == "Run run-q (make): queued for 0s."
    assert files_in.startswith("Files in: part'0.csv (10 bytes), ")  # no backtick opens a code span
    assert files_in.endswith(f"part'{MAX_LISTED_FILES - 1}.csv (10 bytes) and 3 more")
    assert said == "No output to show: it has no container yet."


async def test_a_runs_web_totals_and_latest_connections_come_after_its_files(db: Database, tmp_path: Path) -> None:
    async with MemoryRuntime(on_start=never_exits) as runtime:
        runs = Runs(db, runtime, tmp_path)
        await runs.running("run-w", logs=b"installing\n")
        await give(db, "run-w", CHAT, [("req.txt", 300, FileKind.DOCUMENT)])
        early = [allowed("run-w", CHAT, f"mirror{n}.example", 443, "192.0.2.7", down=1000, up=200) for n in range(5)]
        await record(db, "run-w", early)
        await record(
            db,
            "run-w",
            [
                allowed("run-w", CHAT, "pypi.org", 443, "151.101.0.223", down=1024 * 1024),
                refused("run-w", CHAT, "evil.example", 443, "evil.example:443 is not in\nSUBAGENT_EGRESS_ALLOW"),
                allowed("run-w", CHAT, "files.pythonhosted.org", 443, "151.101.1.63", down=2048, up=1024),
            ],
            past_the_cap=[refused("run-w", CHAT, "x.example", 80, "x.example:80 is not in SUBAGENT_EGRESS_ALLOW")],
        )

        text = await runs.view.run_output(CHAT, "run-w")

    assert text is not None
    lines = text.split("\n")
    assert lines[1] == "Files in: req.txt (300 bytes)"
    assert lines[2] == "Web: 9 connections (2 refused), 1.0 MB down, 2 KB up; the last 5:"
    assert lines[3:8] == [
        "mirror3.example:443 → 192.0.2.7, 1000 bytes down, 200 bytes up",
        "mirror4.example:443 → 192.0.2.7, 1000 bytes down, 200 bytes up",
        "pypi.org:443 → 151.101.0.223, 1.0 MB down",
        "evil.example:443 refused: evil.example:443 is not in SUBAGENT_EGRESS_ALLOW",
        "files.pythonhosted.org:443 → 151.101.1.63, 2 KB down, 1 KB up",
    ]
    assert "\n".join(lines[8:]) == "Output so far:\n```\ninstalling\n```"


async def _noop() -> None:
    return None


class _NoLifecycle:
    async def turn_started(self, turn: object) -> None: ...

    async def turn_ended(self, turn: object, status: str) -> None: ...

    async def turn_aborted(self, turn: object, reason: object) -> None: ...
