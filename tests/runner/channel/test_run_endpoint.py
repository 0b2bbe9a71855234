"""The progress messages a run can repeat without breaking a rule: a retry learns its message went out once, and
a run told its messages are used up is told once; each repeat beyond counts against the run, as the review
found a run could repeat them for its whole life. Over the real socket, with the real inbox and store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.protocol import MESSAGE_PATH
from runner.channel.run_endpoint import MAX_INVALID_REQUESTS
from runner.runs.live_runs import StopReason
from tests.runner.channel.file_desk_rig import DeskRig, desk_rig
from tests.runner.channel.run_api_client import Answer, Request, exchange

MAX_MESSAGES = 5  # the rig's


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DeskRig]:
    async with desk_rig(tmp_path, monkeypatch) as made:
        yield made


async def message(rig: DeskRig, message_id: str) -> tuple[int, str]:
    body = json.dumps({"message_id": message_id, "text": f"news {message_id}"}).encode()
    answer: Answer = await exchange(rig.socket, Request("POST", MESSAGE_PATH, body))
    return answer.status, json.loads(answer.body)["detail"]


async def test_a_retry_learns_its_message_went_out_once_then_repeats_count(rig: DeskRig) -> None:
    assert await message(rig, "msg-0001") == (200, "sent")
    assert await message(rig, "msg-0001") == (200, "already sent")
    assert rig.invalid_count == 0

    for repeat in range(MAX_INVALID_REQUESTS):
        status, _ = await message(rig, "msg-0001")
        assert (status, rig.invalid_count) == (409, repeat + 1)
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS
    assert len(await rig.out_rows()) == 1  # the chat got it once


async def test_messages_over_the_budget_are_refused_once_freely_then_counted(rig: DeskRig) -> None:
    for number in range(MAX_MESSAGES):
        assert await message(rig, f"msg-{number:04d}") == (200, "sent")
    status, detail = await message(rig, "msg-over-0")
    assert (status, rig.invalid_count) == (429, 0) and "put the rest in the final answer" in detail

    for repeat in range(MAX_INVALID_REQUESTS):
        status, _ = await message(rig, f"msg-over-{repeat + 1}")
        assert (status, rig.invalid_count) == (429, repeat + 1)
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS
    assert len(await rig.out_rows()) == MAX_MESSAGES
