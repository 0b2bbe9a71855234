"""The host learns a run's first LLM request by running the container's own code (runner/first_call.py): it
must be the very request the container then sends, for both wire formats, with a prior session and chat
context, or the host's early call would be wasted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models import override_allow_model_requests

from container.__main__ import EXIT_COMPLETED, run_main
from container.paths import ContainerPaths
from runner.first_call import FirstRequestUnknown, learn_first_request
from runner.llm_prefetch import body_key
from tests.container.agent_helpers import make_task, scripted_host
from tests.container.scripted_llm import TextReply

pytestmark = pytest.mark.usefixtures("allow_requests_to_the_local_fake")


def prior_session() -> list[Any]:
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content="Task (earlier):\nCount the files.")]),
        ModelResponse(parts=[TextPart(content="There are 3 files.")]),
    ]
    loaded: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(history))
    return loaded


@pytest.mark.parametrize(("provider_kind", "path"), [("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")])
@pytest.mark.parametrize("with_session", [False, True])
async def test_the_learned_request_is_the_one_the_container_sends(
    paths: ContainerPaths, provider_kind: str, path: str, with_session: bool
) -> None:
    task_fields: dict[str, Any] = {
        "provider_kind": provider_kind,
        "model": "scripted-model",
        "context": ["alice: the logs are in /workspace/logs", "bob: thanks"],
        "history": prior_session() if with_session else [],
    }
    host = scripted_host(paths, [TextReply("done")], **task_fields)
    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    learned = await asyncio.to_thread(learn_first_request, make_task(**task_fields), paths.workspace_dir)

    assert learned.path == path
    sent = host.requests[0]
    assert body_key(path, json.loads(learned.body)) == body_key(path, sent)
    if with_session:
        assert "There are 3 files." in learned.body.decode()


def test_a_task_whose_session_is_not_a_history_is_learned_as_the_container_starts_it() -> None:
    # The container drops an unusable session and starts fresh; the host's copy does the same.
    learned = learn_first_request(make_task(history=[{"kind": "not a message"}]))

    body = json.loads(learned.body)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_code_that_fails_before_its_first_request_is_reported_with_its_reason() -> None:
    with override_allow_model_requests(False), pytest.raises(FirstRequestUnknown, match="ALLOW_MODEL_REQUESTS"):
        learn_first_request(make_task())
