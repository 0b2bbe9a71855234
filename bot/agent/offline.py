"""The offline demo model: a deterministic stand-in (not an LLM) so crewbot runs with no API key.

It answers plainly, quoting the latest message and what it can see of the chat. When the latest message
contains `background:` it calls spawn_subagent with the text after it as the task; the offline subagent
model then runs each line of that task that starts with `$ ` as a shell command, e.g.

    @crew background: $ echo hello from a container

The files a message carries or replies to (`[file f3: …]`) go with its task, as in the console's
`/file data.csv background: $ wc -l inbox/data.csv`.

`schedule:` asks for a scheduled task the same way: the schedule, then the task from its `$ ` on, e.g.
`schedule: every 2m $ date` or `schedule: 2026-12-01T09:00 $ echo hi`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bot.agent.prompt import LATEST_MARKER, REPLIED_FILE_NOTE

BACKGROUND_PHRASE = "background:"
SPAWN_TOOL = "spawn_subagent"
SCHEDULE_PHRASE = "schedule:"
SCHEDULE_TOOL = "schedule_task"
ANSWERED_TOOLS = frozenset({SPAWN_TOOL, SCHEDULE_TOOL})
MAX_QUOTE_CHARS = 200
STREAM_WORDS = 4  # words per streamed piece
TRANSCRIPT_HEADING = "Chat transcript (oldest first):\n"
# A transcript line as bot.agent.prompt writes it: "[2026-01-31 12:00] Alice: text" (text may go on below).
_TRANSCRIPT_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d\] (?P<sender>.+?): (?P<text>.*)$")
_SUBAGENT_SENDER = "[Subagent]"
_FILE_REF = re.compile(r"\[file (f[0-9]+): ")  # a file as bot.agent.prompt shows it
_SHOWN = re.compile(r"\(shown to you as image (\d+), (\d+×\d+)\)")  # an image the prompt sends (bot/senses/window.py)
_HEARD = re.compile(r"\[(?:voice|video note|audio) [0-9:?]+, f[0-9]+[^\]]*\] (\"(?:[^\"\\]|\\.)*\"|\([^)]*\))")


@dataclass(slots=True)
class _Said:
    sender: str
    text: str


def prompt_text(messages: list[ModelMessage]) -> str:
    """The user prompt of a model request (the transcript the prompt builder made; its images follow it)."""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    if isinstance(part.content, str):
                        return part.content
                    return next((item for item in part.content if isinstance(item, str)), "")
    return ""


def _latest(prompt: str) -> tuple[str, str]:
    """(sender, text) of the latest message, as the prompt builder marks it."""
    _, marker, tail = prompt.rpartition(LATEST_MARKER)
    if not marker:
        return "", ""
    sender, _, rest = tail.partition(":\n")
    text, _, _ = rest.rpartition("\n\nWrite ")
    return sender, text.strip()


def _transcript(prompt: str) -> list[_Said]:
    """The transcript's messages, oldest first (a line that does not start a message continues the last)."""
    _, heading, body = prompt.partition(TRANSCRIPT_HEADING)
    if not heading:
        return []
    body = body.rpartition(f"\n\n{LATEST_MARKER}")[0] or body.rpartition("\n\nWrite ")[0]
    said: list[_Said] = []
    for line in body.split("\n"):
        match = _TRANSCRIPT_LINE.match(line)
        if match:
            said.append(_Said(match["sender"], match["text"]))
        elif said:
            said[-1].text += "\n" + line
    return said


def _unanswered(prompt: str, sender: str, assistant_name: str) -> list[str]:
    """What `sender` wrote since the bot last spoke (its answer or a subagent result), oldest first."""
    texts: list[str] = []
    for said in reversed(_transcript(prompt)):
        if said.sender in (f"{assistant_name} (you)", _SUBAGENT_SENDER):
            break
        if said.sender == sender:
            texts.append(said.text.strip())
    return texts[::-1]


def _background_tasks(texts: list[str]) -> list[tuple[str, list[str]]]:
    """The task of each message that asks for one, oldest first, with the files it carries or replies to."""
    tasks = []
    for text in texts:
        lowered = text.lower()
        if BACKGROUND_PHRASE in lowered:
            task = text[lowered.index(BACKGROUND_PHRASE) + len(BACKGROUND_PHRASE) :]
            task = "\n".join(line for line in task.split("\n") if not line.startswith(REPLIED_FILE_NOTE)).strip()
            if task:
                tasks.append((task, list(dict.fromkeys(_FILE_REF.findall(text)))))
    return tasks


def _scheduled(texts: list[str]) -> list[tuple[str, str]]:
    """(schedule, task) of each message that asks for a scheduled task, oldest first."""
    found = []
    for text in texts:
        lowered = text.lower()
        if SCHEDULE_PHRASE not in lowered:
            continue
        rest = text[lowered.index(SCHEDULE_PHRASE) + len(SCHEDULE_PHRASE) :]
        when, dollar, task = rest.partition("$ ")
        if dollar and when.strip() and task.strip():
            found.append((when.strip(), f"$ {task.strip()}"))
    return found


def _merged_note(count: int) -> str:
    return f"(Your {count} messages since my last answer are answered together here.)" if count > 1 else ""


def _label_for(task: str) -> str:
    first = task.strip().splitlines()[0] if task.strip() else "task"
    first = first.removeprefix("$ ").strip()
    return first if len(first) <= 40 else first[:39] + "…"


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_QUOTE_CHARS else flat[: MAX_QUOTE_CHARS - 1] + "…"


def _image_count(messages: list[ModelMessage]) -> int:
    """How many images the request carries (after its transcript)."""
    last = messages[-1] if messages else None
    if not isinstance(last, ModelRequest):
        return 0
    return sum(
        1
        for part in last.parts
        if isinstance(part, UserPromptPart) and not isinstance(part.content, str)
        for item in part.content
        if isinstance(item, BinaryContent) and item.is_image
    )


def _senses(prompt: str, latest: str, images: int) -> list[str]:
    """What the demo model was shown and heard: the images' sizes, and the latest message's transcript."""
    said = []
    if images:
        sizes = {number: size for number, size in _SHOWN.findall(prompt)}
        shown = ", ".join(f"image {n} ({sizes.get(str(n), 'size unknown')})" for n in range(1, images + 1))
        said.append(f"I was shown {images} image(s): {shown}; a real model would say what they show.")
    heard = _HEARD.search(latest)
    if heard is not None:
        said.append(f"I heard: {heard.group(1)}.")
    return said


def offline_main_model(assistant_name: str) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = prompt_text(messages)
        sender, text = _latest(prompt)
        # Only what was not answered yet: a second turn over the same messages must not spawn them again.
        pending = _unanswered(prompt, sender, assistant_name) if sender else []
        if text and pending and text.startswith(pending[-1][:MAX_QUOTE_CHARS]):
            # The transcript may show a long message cut; the latest section has it whole, and the file
            # the message replies to.
            pending[-1] = text
        note = _merged_note(len(pending))
        last = messages[-1]
        if isinstance(last, ModelRequest):
            returns = [p for p in last.parts if isinstance(p, ToolReturnPart) and p.tool_name in ANSWERED_TOOLS]
            if returns:
                return ModelResponse(parts=[TextPart(" ".join([*(f"{p.content}" for p in returns), note]).strip())])
        can_spawn = any(tool.name == SPAWN_TOOL for tool in info.function_tools)
        can_schedule = any(tool.name == SCHEDULE_TOOL for tool in info.function_tools)
        schedules = _scheduled(pending) if can_schedule else []
        if schedules:
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        SCHEDULE_TOOL,
                        {"prompt": task, "schedule": when, "label": _label_for(task)},
                        tool_call_id=f"offline-schedule-{n}",
                    )
                    for n, (when, task) in enumerate(schedules)
                ]
            )
        tasks = _background_tasks(pending) if can_spawn else []
        if tasks:
            calls = [
                ToolCallPart(
                    SPAWN_TOOL,
                    {"task": task, "label": _label_for(task), "include_context": False}
                    | ({"files": files} if files else {}),
                    tool_call_id=f"offline-spawn-{n}",
                )
                for n, (task, files) in enumerate(tasks)
            ]
            return ModelResponse(parts=list(calls))
        lines = [line for line in prompt.splitlines() if line.startswith("[")]
        results = [line for line in lines if "] [Subagent]: " in line]
        reply = [f"Offline demo model here: no LLM is configured, so {assistant_name} answers from a script."]
        if text:
            reply.append(f"{sender or 'You'} wrote: “{_quote(text)}”.")
        reply += _senses(prompt, text, _image_count(messages))
        if note:
            reply.append(note)
        reply.append(f"I can see {len(lines)} message(s) of this chat.")
        if results:
            reply.append(f"Latest subagent result: {_quote(results[-1].split('] [Subagent]: ', 1)[1])}")
        if can_spawn:
            reply.append(f"To try a subagent, write: {BACKGROUND_PHRASE} $ echo hello")
        if can_schedule:
            reply.append(f"To schedule one, write: {SCHEDULE_PHRASE} every 2m $ date")
        return ModelResponse(parts=[TextPart(" ".join(reply))])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        """The same answer streamed (STREAM_REPLIES): its text a few words at a time, its tool calls whole."""
        response = respond(messages, info)
        for index, part in enumerate(response.parts):
            if isinstance(part, ToolCallPart):
                yield {
                    index: DeltaToolCall(
                        name=part.tool_name, json_args=part.args_as_json_str(), tool_call_id=part.tool_call_id
                    )
                }
            elif isinstance(part, TextPart):
                words = part.content.split(" ")
                for start in range(0, len(words), STREAM_WORDS):
                    yield " ".join(words[start : start + STREAM_WORDS]) + (
                        " " if start + STREAM_WORDS < len(words) else ""
                    )

    return FunctionModel(respond, stream_function=stream, model_name="crewbot-offline")
