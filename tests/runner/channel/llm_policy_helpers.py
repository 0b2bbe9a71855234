"""What the RequestPolicy tests share: policies for each provider with and without provider tools, requests
and tools to send them, and `sanitize` / `refused` to run a policy on a request."""

from __future__ import annotations

from typing import Any

import pytest

from core.settings import LLMProvider
from runner.channel.llm_policy import RequestPolicy, Sanitized
from runner.channel.proxy_error import ProxyError

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
