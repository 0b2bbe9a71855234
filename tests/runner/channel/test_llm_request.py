"""A call as the proxy forwards it: its bytes are what the provider gets, and its images are held at what a
provider may bill for one (their bytes do not bound it: a 304-byte PNG is billed about 1,600 tokens), wherever
they are in the conversation; content billed by a length the host cannot know first is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.settings import LLMProvider
from runner.channel.llm_budget import BudgetSpent, input_hold
from runner.channel.llm_policy import RequestPolicy
from runner.channel.llm_request import IMAGE_HOLD_TOKENS, prepared
from runner.channel.llm_upstream import Upstream, UpstreamConfig
from runner.channel.proxy_error import ProxyError
from tests.runner.channel.llm_policy_helpers import ANTHROPIC, MODEL, OPENAI, PLENTY

PNG = "data:image/png;base64,iVBORw0KGgo="
OPENAI_IMAGE = {"type": "image_url", "image_url": {"url": PNG}}
ANTHROPIC_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def forwarded_of(policy: RequestPolicy, payload: dict[str, Any], followups: list[str] | None = None) -> Any:
    upstream = Upstream(UpstreamConfig(policy.provider, "http://provider.test"), policy, None)
    body = json.dumps(payload).encode()
    return prepared(policy, upstream, policy.path, body, followups or [], PLENTY)


def test_the_bytes_are_what_the_provider_gets_follow_ups_included() -> None:
    sent = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}

    call = forwarded_of(OPENAI, sent, ["say it in French"])

    got = json.loads(call.data)
    assert got["model"] == MODEL and "say it in French" in got["messages"][-1]["content"]
    assert call.data == json.dumps(call.payload).encode() and call.media_tokens == 0


def test_openai_images_are_held_each_at_the_ceiling() -> None:
    content = [{"type": "text", "text": "look"}, OPENAI_IMAGE, OPENAI_IMAGE]
    call = forwarded_of(OPENAI, {"model": "x", "messages": [{"role": "user", "content": content}]})

    assert call.media_tokens == 2 * IMAGE_HOLD_TOKENS


def test_anthropic_images_inside_a_tool_result_and_the_system_are_held() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [ANTHROPIC_IMAGE, ANTHROPIC_IMAGE]}
    payload = {
        "model": "x",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "s"}, ANTHROPIC_IMAGE],
        "messages": [{"role": "user", "content": [result]}],
    }

    assert forwarded_of(ANTHROPIC, payload).media_tokens == 3 * IMAGE_HOLD_TOKENS


def test_a_tool_calls_own_arguments_are_not_content() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "bash", "input": {"type": "image", "note": "an argument"}}
    payload = {"model": "x", "max_tokens": 10, "messages": [{"role": "assistant", "content": [use]}]}

    assert forwarded_of(ANTHROPIC, payload).media_tokens == 0


@pytest.mark.parametrize(
    ("policy", "block"),
    [
        (OPENAI, {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
        (OPENAI, {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0="}}),
        (ANTHROPIC, {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "x"}}),
    ],
)
def test_content_billed_by_an_unknown_length_is_refused(policy: RequestPolicy, block: dict[str, Any]) -> None:
    payload = {"model": "x", "max_tokens": 10, "messages": [{"role": "user", "content": [block]}]}

    with pytest.raises(ProxyError) as refused:
        forwarded_of(policy, payload)

    assert refused.value.status == 400 and "cannot be bounded" in refused.value.message


def test_a_run_whose_budget_cannot_hold_its_images_is_refused_before_forwarding() -> None:
    call = forwarded_of(OPENAI, {"model": "x", "messages": [{"role": "user", "content": [OPENAI_IMAGE] * 3}]})
    with pytest.raises(BudgetSpent):
        input_hold(3 * IMAGE_HOLD_TOKENS, 0, 0, len(call.data), call.media_tokens)


def test_the_provider_kind_does_not_matter_for_counting() -> None:
    offline = RequestPolicy(LLMProvider.OFFLINE, MODEL, allow_provider_tools=False)
    call = forwarded_of(offline, {"model": "x", "messages": [{"role": "user", "content": [OPENAI_IMAGE]}]})

    assert call.media_tokens == IMAGE_HOLD_TOKENS
