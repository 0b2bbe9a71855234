"""The subagents' LLM for hostile-subagent tests: FakeLLM behind the host's proxy, answering by the offline
model's rules (each `$ ` line of the task is run through the bash tool), at a few tokens a call, with three
twists a task can ask for:

- `hold: KEY`: the run's final answer waits until the test calls `release(KEY)`, so the test can act while the
  container is alive and its attacks are done;
- `spend: N`: every call of the run reports N input tokens;
- `answer chars: N`: the final answer is N characters long.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from typing import Any

from runner.channel.offline_subagent import OfflineRequestError, OfflineSubagentModel, message_text

TOKENS_PER_CALL = 10  # what an ordinary call reports: far below the budget, however many a run makes
RUN_WAIT_SECONDS = 90.0  # container start-up is slow on a loaded 2-core machine

LONG_ANSWER_LINE = "a long answer, line after line\n"

_HOLD = re.compile(r"^hold: (\S+)$", re.M)
_SPEND = re.compile(r"^spend: (\d+)$", re.M)
_ANSWER_CHARS = re.compile(r"^answer chars: (\d+)$", re.M)


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
