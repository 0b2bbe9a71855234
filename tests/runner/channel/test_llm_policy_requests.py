"""RequestPolicy on concrete hostile requests: the one endpoint each provider serves, the body's shape, the
top-level keys that pass, output tokens capped by the ceiling and the run's budget, the headers that reach
the provider, and what a policy needs."""

from __future__ import annotations

import json

import pytest

from core.settings import LLMProvider
from runner.channel.llm_policy import (
    CHAT_COMPLETIONS_PATH,
    MAX_DROPPED_LABELS,
    MAX_LABEL_CHARS,
    MESSAGES_PATH,
    RequestPolicy,
)
from runner.channel.proxy_error import ProxyError
from tests.runner.channel.llm_policy_helpers import (
    ANTHROPIC,
    ANTHROPIC_TOOLS,
    MODEL,
    OFFLINE,
    OPENAI,
    OPENAI_BASH,
    OPENAI_TOOLS,
    PLENTY,
    body,
    refused,
    sanitize,
)

# --- endpoints -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "path"), [(OPENAI, CHAT_COMPLETIONS_PATH), (OFFLINE, CHAT_COMPLETIONS_PATH), (ANTHROPIC, MESSAGES_PATH)]
)
def test_each_provider_serves_its_one_endpoint(policy: RequestPolicy, path: str) -> None:
    policy.check_path(path)
    assert policy.path == path


@pytest.mark.parametrize("policy", [OPENAI, OFFLINE, ANTHROPIC, OPENAI_TOOLS, ANTHROPIC_TOOLS])
@pytest.mark.parametrize(
    "path", ["/v1/responses", "/v1/embeddings", "/v1/files", "/v1/messages/batches", "/v1/chat/completions/", ""]
)
def test_other_endpoints_are_not_served_even_with_provider_tools(policy: RequestPolicy, path: str) -> None:
    if path == policy.path:
        return
    with pytest.raises(ProxyError) as info:
        policy.check_path(path)
    assert (info.value.status, info.value.error_type) == (404, "endpoint_not_served")
    with pytest.raises(ProxyError) as info:
        policy.sanitize(path, body(), PLENTY)
    assert info.value.status == 404


def test_each_provider_refuses_the_other_providers_endpoint() -> None:
    for policy, path in [(OPENAI, MESSAGES_PATH), (OFFLINE, MESSAGES_PATH), (ANTHROPIC, CHAT_COMPLETIONS_PATH)]:
        with pytest.raises(ProxyError):
            policy.check_path(path)


# --- the body's shape ------------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [[], "text", None, 3, [body()]])
def test_a_body_that_is_not_an_object_is_refused(payload: object) -> None:
    error = refused(OPENAI, payload)
    assert (error.status, error.error_type) == (400, "invalid_request")


@pytest.mark.parametrize("policy", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize("messages", [None, "hi", {"role": "user"}, 3])
def test_messages_must_be_a_list(policy: RequestPolicy, messages: object) -> None:
    payload = body(messages=messages) if messages is not None else {"model": "m"}
    assert refused(policy, payload).status == 400


def test_stream_options_must_be_an_object() -> None:
    assert refused(OPENAI, body(stream=True, stream_options=[1])).status == 400
    assert sanitize(OPENAI, body(stream=True, stream_options={"include_usage": True})).payload["stream_options"]


# --- top-level keys --------------------------------------------------------------------------------------


def test_openai_keys_outside_the_allow_list_are_dropped_and_listed() -> None:
    extra = {
        "n": 8,
        "service_tier": "priority",
        "store": True,
        "logit_bias": {"1": 100},
        "prediction": {"type": "content", "content": "x"},
        "web_search_options": {},
        "metadata": {"a": "b"},
    }
    result = sanitize(OPENAI, body(temperature=0.2, stream=False, **extra))
    assert set(result.payload) == {"model", "messages", "temperature", "stream", "max_completion_tokens"}
    assert set(result.dropped) == set(extra)


def test_anthropic_keys_outside_the_allow_list_are_dropped_and_listed() -> None:
    extra = {
        "n": 8,
        "service_tier": "auto",
        "speed": "fast",
        "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}],
        "container": "container_1",
        "context_management": {},
    }
    result = sanitize(ANTHROPIC, body(system="be brief", top_k=5, max_tokens=100, **extra))
    assert set(result.payload) == {"model", "messages", "system", "top_k", "max_tokens"}
    assert set(result.dropped) == set(extra)


def test_provider_tool_keys_pass_only_when_provider_tools_are_allowed() -> None:
    openai = sanitize(OPENAI_TOOLS, body(web_search_options={}, service_tier="priority", n=3))
    assert "web_search_options" in openai.payload
    assert set(openai.dropped) == {"service_tier", "n"}
    anthropic = sanitize(ANTHROPIC_TOOLS, body(mcp_servers=[], container="c", service_tier="auto"))
    assert {"mcp_servers", "container"} <= set(anthropic.payload)
    assert anthropic.dropped == ("service_tier",)


@pytest.mark.parametrize("policy", [OPENAI, OFFLINE, ANTHROPIC])
def test_the_model_is_pinned_whatever_was_asked(policy: RequestPolicy) -> None:
    assert sanitize(policy, body()).payload["model"] == MODEL
    assert sanitize(policy, {"messages": []}).payload["model"] == MODEL
    assert sanitize(policy, body(model=["a", "list"])).payload["model"] == MODEL


def test_the_callers_payload_is_not_modified() -> None:
    payload = body(n=4, max_tokens=10**9, tools=[OPENAI_BASH, {"type": "web_search"}], tool_choice="auto")
    before = json.dumps(payload)
    sanitize(OPENAI, payload)
    assert json.dumps(payload) == before
    thinking = body(max_tokens=2_000, thinking={"type": "enabled", "budget_tokens": 10**9})
    before = json.dumps(thinking)
    sanitize(ANTHROPIC, thinking)
    assert json.dumps(thinking) == before


def test_dropped_labels_are_bounded_in_number_and_length() -> None:
    junk = {f"{'k' * 500}{i}": i for i in range(1_000)}
    dropped = sanitize(OPENAI, body(**junk)).dropped
    assert len(dropped) == MAX_DROPPED_LABELS + 1
    assert all(len(label) <= MAX_LABEL_CHARS for label in dropped)
    assert dropped[-1] == f"... and {1_000 - MAX_DROPPED_LABELS} more"


# --- output tokens ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "ceiling", "remaining", "expected"),
    [
        (10**30, 16_384, PLENTY, 16_384),  # the per-call ceiling
        (10**30, 16_384, 500, 500),  # what is left of the run's budget
        (800, 16_384, PLENTY, 800),  # a modest request stands
        (0, 16_384, PLENTY, 1),
        (-(10**30), 16_384, PLENTY, 1),
        (None, 4_096, PLENTY, 4_096),  # not asked: the ceiling is set
        (None, 4_096, 7, 7),
    ],
)
@pytest.mark.parametrize("provider", list(LLMProvider))
def test_output_tokens_are_capped(
    provider: LLMProvider, requested: int | None, ceiling: int, remaining: int, expected: int
) -> None:
    policy = RequestPolicy(provider, MODEL, allow_provider_tools=False, max_output_tokens=ceiling)
    key = "max_tokens" if provider is LLMProvider.ANTHROPIC else "max_completion_tokens"
    payload = body() if requested is None else body(**{key: requested})
    assert sanitize(policy, payload, remaining).payload[key] == expected


def test_openai_keeps_the_token_field_it_was_given() -> None:
    only_max_tokens = sanitize(OPENAI, body(max_tokens=10**9)).payload
    assert only_max_tokens["max_tokens"] == OPENAI.max_output_tokens
    assert "max_completion_tokens" not in only_max_tokens
    both = sanitize(OPENAI, body(max_tokens=10**9, max_completion_tokens=50))
    assert (both.payload["max_tokens"], both.payload["max_completion_tokens"]) == (OPENAI.max_output_tokens, 50)
    assert both.output_cap == OPENAI.max_output_tokens  # the larger of the two is what the call may spend


@pytest.mark.parametrize("policy", [OPENAI, ANTHROPIC])
def test_output_cap_is_what_the_call_may_spend(policy: RequestPolicy) -> None:
    assert sanitize(policy, body(max_tokens=300)).output_cap == 300
    assert sanitize(policy, body(max_tokens=10**9), remaining=77).output_cap == 77
    assert sanitize(policy, body()).output_cap == policy.max_output_tokens


@pytest.mark.parametrize("policy", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize("value", ["100000", 1e9, float("inf"), True, None, [5], {"n": 5}])
def test_a_token_count_that_is_not_an_integer_is_refused(policy: RequestPolicy, value: object) -> None:
    error = refused(policy, body(max_tokens=value))
    assert (error.status, error.error_type) == (400, "invalid_request")


@pytest.mark.parametrize("policy", [OPENAI, OFFLINE, ANTHROPIC, OPENAI_TOOLS])
@pytest.mark.parametrize("remaining", [0, -1, -(10**12)])
def test_a_spent_budget_is_refused_with_429(policy: RequestPolicy, remaining: int) -> None:
    error = refused(policy, body(max_tokens=1), remaining)
    assert (error.status, error.error_type) == (429, "run_token_budget")
    assert "SUBAGENT_MAX_TOKENS" in error.message


def test_anthropic_thinking_budget_stays_below_max_tokens() -> None:
    asked = body(max_tokens=10**9, thinking={"type": "enabled", "budget_tokens": 10**9})
    payload = sanitize(ANTHROPIC, asked, remaining=5_000).payload
    assert payload["max_tokens"] == 5_000
    assert payload["thinking"] == {"type": "enabled", "budget_tokens": 4_999}
    modest = body(max_tokens=8_000, thinking={"type": "enabled", "budget_tokens": 2_048})
    assert sanitize(ANTHROPIC, modest).payload["thinking"]["budget_tokens"] == 2_048
    adaptive = body(thinking={"type": "adaptive"})
    assert sanitize(ANTHROPIC, adaptive).payload["thinking"] == {"type": "adaptive"}


@pytest.mark.parametrize("thinking", ["on", [1], {"type": "enabled", "budget_tokens": "9"}, {"budget_tokens": 1.5}])
def test_a_malformed_thinking_setting_is_refused(thinking: object) -> None:
    assert refused(ANTHROPIC, body(thinking=thinking)).status == 400


# --- headers ---------------------------------------------------------------------------------------------


def test_only_harmless_headers_reach_the_provider() -> None:
    incoming = {
        "Accept": "application/json",
        "Anthropic-Version": "2023-06-01",
        "Anthropic-Beta": "mcp-client-2025-04-04",
        "OpenAI-Beta": "assistants=v2",
        "Authorization": "Bearer stolen",
        "x-api-key": "stolen",
        "Cookie": "a=b",
        "Host": "llm",
    }
    assert OPENAI.headers(incoming) == {"accept": "application/json", "anthropic-version": "2023-06-01"}
    assert ANTHROPIC_TOOLS.headers(incoming) == {
        "accept": "application/json",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "mcp-client-2025-04-04",
        "openai-beta": "assistants=v2",
    }


def test_a_header_value_with_a_line_break_is_not_forwarded() -> None:
    assert ANTHROPIC.headers({"accept": "a\r\nx-api-key: k", "anthropic-version": "2023-06-01"}) == {
        "anthropic-version": "2023-06-01"
    }


@pytest.mark.parametrize(("model", "ceiling"), [("", 100), (MODEL, 0), (MODEL, -1)])
def test_a_policy_needs_a_model_and_a_positive_ceiling(model: str, ceiling: int) -> None:
    with pytest.raises(ValueError):
        RequestPolicy(LLMProvider.OPENAI, model, allow_provider_tools=False, max_output_tokens=ceiling)
