"""RequestPolicy for any JSON a hostile subagent can send, on any path (property test): a body that keeps every
rule comes back, or a 4xx; the caller's payload is left alone."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.settings import LLMProvider
from runner.channel.llm_policy import (
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
from runner.channel.proxy_error import ProxyError

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
