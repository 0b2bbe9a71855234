"""The main agent's scheduled-task tools through a real pydantic-ai Agent and a real task book: the offline
model's `schedule:` for a newcomer, and list/pause/resume/cancel with the requester's rights."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.deps import TurnDeps
from bot.agent.offline import offline_main_model
from bot.agent.task_tools import TASK_TOOLS
from bot.turns.engine import Turn
from core.store.schedules import TaskStatus
from tests.bot.helpers import RecordingSpawner
from tests.bot.schedules.rig import CHAT, CREATOR, Rig, open_rig

OTHER = 77


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = await open_rig(tmp_path / "db.sqlite3", start=False, min_interval_seconds=300)
    yield rig
    await rig.stop()


def deps(rig: Rig, requester: int) -> TurnDeps:
    turn = Turn(id="turn-tasks", chat_id=CHAT, started_at=0.0)
    return TurnDeps(chat_id=CHAT, turn=turn, spawner=RecordingSpawner(), tasks=rig.book, requester_id=requester)


def returns(messages: list[ModelMessage]) -> list[str]:
    return [
        str(p.content)
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


@pytest.mark.parametrize(
    ("text", "schedule", "said"),
    [
        ("@crew schedule: 2026-12-01T09:00 $ echo hi", "2026-12-01T09:00", "once at 2026-12-01 09:00"),
        ("@crew schedule: every 2h $ date", "every 2h", "every 2 hours"),
    ],
)
async def test_the_offline_model_schedules_what_follows_schedule(rig: Rig, text: str, schedule: str, said: str) -> None:
    agent = Agent(offline_main_model("Crew"), deps_type=TurnDeps, tools=list(TASK_TOOLS))
    prompt = f"Chat transcript (oldest first):\n[2026-11-23 04:00] Alice: {text}\n\nLatest message, from Alice:\n{text}"

    result = await agent.run(prompt + "\n\nWrite Crew's reply.", deps=deps(rig, CREATOR))

    calls = [p for m in result.all_messages() if isinstance(m, ModelResponse) for p in m.parts]
    call = next(p for p in calls if isinstance(p, ToolCallPart))
    assert call.tool_name == "schedule_task" and call.args_as_dict()["schedule"] == schedule
    [task] = await rig.store.for_chat(CHAT)
    assert task.creator_id == CREATOR and task.prompt == "$ " + text.split("$ ", 1)[1]
    assert result.output.startswith(f"Scheduled task {task.id} (") and said in result.output


def scripted(calls: list[tuple[str, dict[str, str]]]) -> FunctionModel:
    """Calls each tool in turn, then says done."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)
        if done < len(calls):
            name, args = calls[done]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call-{done}")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


async def test_tools_list_pause_resume_and_cancel_for_the_creator_only(rig: Rig) -> None:
    task = await rig.book.schedule(CHAT, CREATOR, "check the build", "every 1h", label="build")
    steps = [
        ("pause_task", {"id": task.id}),
        ("list_tasks", {}),
        ("resume_task", {"id": task.id}),
        ("cancel_task", {"id": task.id}),
    ]

    other = await Agent(scripted(steps[:1]), deps_type=TurnDeps, tools=list(TASK_TOOLS)).run(
        "go", deps=deps(rig, OTHER)
    )
    mine = await Agent(scripted(steps), deps_type=TurnDeps, tools=list(TASK_TOOLS)).run("go", deps=deps(rig, CREATOR))

    assert returns(other.all_messages()) == [
        f"Refused: only the task's creator or a chat admin can pause task {task.id}."
    ]
    paused, listed, resumed, cancelled = returns(mine.all_messages())
    assert paused == f"Paused scheduled task {task.id} (build)."
    assert f"`{task.id}` build · every 1 hour" in listed and "PAUSED" in listed
    assert resumed.startswith(f"Resumed scheduled task {task.id} (build); next due ")
    assert cancelled == f"Cancelled scheduled task {task.id} (build)."
    ended = await rig.store.get(task.id)
    assert ended is not None and ended.status is TaskStatus.CANCELLED


async def test_a_refused_schedule_comes_back_to_the_model_with_its_reason(rig: Rig) -> None:
    steps = [("schedule_task", {"prompt": "$ date", "schedule": "every 10s"})]

    result = await Agent(scripted(steps), deps_type=TurnDeps, tools=list(TASK_TOOLS)).run("go", deps=deps(rig, CREATOR))

    assert returns(result.all_messages()) == [
        "Not scheduled: every 10s is shorter than the minimum interval of 300 seconds."
    ]
    assert await rig.store.for_chat(CHAT) == []
