"""What a subagent's LLM request may ask of the provider: one endpoint, one model, bounded output, no provider tools.

A subagent's request body is hostile input (docs/security.md "The trust boundary"): an LLM following strangers'
instructions can ask for an expensive model, a huge output, several choices, or tools the provider runs itself (web
search, fetch, code execution, MCP servers), which is network access despite network `none` and spend without a
bound.
`RequestPolicy` rebuilds each body from an allow-list before the proxy forwards it, and says what it dropped so
the proxy can log it. It is pure: no I/O, and the caller's payload is never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic_core

from core.settings import LLMProvider
from runner.channel import bounded_json
from runner.channel.bounded_json import BodyRefused
from runner.channel.proxy_error import ProxyError

DEFAULT_MAX_OUTPUT_TOKENS = 16_384  # one call's output ceiling; the run's budget is SUBAGENT_MAX_TOKENS
MAX_DROPPED_LABELS = 20  # a body of a million junk keys must not become a million-entry log line
MAX_LABEL_CHARS = 64
# JSON values a provider request may hold: a long conversation with tools is tens of thousands. Parsing this
# many takes about 15 ms; the cap, not the 8 MB body limit, bounds what a request costs the host.
MAX_REQUEST_VALUES = 200_000
INVALID_REQUEST = "invalid_request"  # a body that is no request at all: the run's invalid ones are counted

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"  # OpenAI and the offline model; /v1/responses is never served
MESSAGES_PATH = "/v1/messages"  # Anthropic

# Top-level keys forwarded, per API. No `n`: several choices multiply one call's output.
# fmt: off
OPENAI_KEYS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "user",
    "tools", "tool_choice", "parallel_tool_calls", "response_format", "stop",
    "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty", "reasoning_effort",
})
ANTHROPIC_KEYS = frozenset({
    "model", "messages", "system", "max_tokens", "stream", "metadata", "thinking",
    "tools", "tool_choice", "stop_sequences", "temperature", "top_p", "top_k",
})
# fmt: on
OPENAI_TOKEN_KEYS = ("max_tokens", "max_completion_tokens")
# Allowed on top only with SUBAGENT_ALLOW_PROVIDER_TOOLS: each makes the provider reach the network for the run.
OPENAI_PROVIDER_TOOL_KEYS = frozenset({"web_search_options"})
ANTHROPIC_PROVIDER_TOOL_KEYS = frozenset({"mcp_servers", "container"})

# The only request headers of the container's that reach the provider (runner/channel/llm_upstream.py asks `headers()`):
# never its Authorization, x-api-key or cookies. Betas switch on server tools, so only with provider tools.
FORWARDED_HEADERS = ("accept", "anthropic-version")
BETA_HEADERS = ("anthropic-beta", "openai-beta")


@dataclass(frozen=True, slots=True)
class Sanitized:
    """The body to forward, labels of what was taken out of it (`service_tier`, `tools[web_search_20250305]`),
    and the most output tokens the body now allows (what the proxy holds back from the budget while it runs)."""

    payload: dict[str, Any]
    dropped: tuple[str, ...]
    output_cap: int


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """The rules for one provider's subagent requests; build it once from the settings and share it."""

    provider: LLMProvider
    model: str  # SUBAGENT_MODEL: every request is pinned to it
    allow_provider_tools: bool  # SUBAGENT_ALLOW_PROVIDER_TOOLS
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("RequestPolicy needs the subagent model's name")
        if self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be at least 1, not {self.max_output_tokens}")

    @property
    def path(self) -> str:
        """The one container-side path served: the endpoint the subagent's SDK uses."""
        return MESSAGES_PATH if self.provider is LLMProvider.ANTHROPIC else CHAT_COMPLETIONS_PATH

    def check_path(self, path: str) -> None:
        if path != self.path:
            shown = path[:MAX_LABEL_CHARS]
            raise ProxyError(404, "endpoint_not_served", f"{shown} is not served here: only POST {self.path}")

    def headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """The container's request headers that reach the provider, names lower-cased; never a key or a cookie."""
        names = FORWARDED_HEADERS + BETA_HEADERS if self.allow_provider_tools else FORWARDED_HEADERS
        return {
            name.lower(): value
            for name, value in incoming.items()
            if name.lower() in names and not any(c in value for c in "\r\n\0")
        }

    def sanitize(self, path: str, payload: object, remaining_tokens: int) -> Sanitized:
        """The body to forward for a call on `path` with `remaining_tokens` left in the run's budget.

        Raises ProxyError: 404 for a path not served, 429 when the budget is spent, 400 for a body
        that cannot be made safe by dropping parts of it.
        """
        self.check_path(path)
        if not isinstance(payload, dict):
            raise _invalid("the request body must be a JSON object")
        if remaining_tokens <= 0:
            raise ProxyError(
                429,
                "run_token_budget",
                "this run has used up its token budget (SUBAGENT_MAX_TOKENS): no more LLM calls; "
                "finish with what you have",
            )
        if not isinstance(payload.get("messages"), list):
            raise _invalid("`messages` must be a list")
        if not isinstance(payload.get("stream_options", {}), dict):
            raise _invalid("`stream_options` must be an object")  # the proxy adds include_usage to it
        anthropic = self.provider is LLMProvider.ANTHROPIC
        allowed = ANTHROPIC_KEYS if anthropic else OPENAI_KEYS
        if self.allow_provider_tools:
            allowed |= ANTHROPIC_PROVIDER_TOOL_KEYS if anthropic else OPENAI_PROVIDER_TOOL_KEYS
        body = {key: value for key, value in payload.items() if key in allowed}
        dropped = [str(key) for key in payload if key not in allowed]
        body["model"] = self.model
        output_cap = _cap_output(body, min(self.max_output_tokens, remaining_tokens), anthropic)
        if anthropic:
            _clamp_thinking(body)
        if not self.allow_provider_tools:
            _keep_function_tools(body, anthropic, dropped)
            if _fetches_by_reference([body["messages"], body.get("system")]):
                raise _invalid(
                    "content the provider would fetch (an image or document by URL, a stored file) is refused: "
                    "the provider's network is not the subagent's (SUBAGENT_ALLOW_PROVIDER_TOOLS is off)"
                )
        return Sanitized(body, _labels(dropped), output_cap)

    def recapped(self, sanitized: Sanitized, output_cap: int) -> Sanitized:
        """The sanitized body with its output lowered to `output_cap` (at least 1; never raised)."""
        body = dict(sanitized.payload)
        anthropic = self.provider is LLMProvider.ANTHROPIC
        capped = _cap_output(body, min(output_cap, sanitized.output_cap), anthropic)
        if anthropic:
            _clamp_thinking(body)
        return Sanitized(body, sanitized.dropped, capped)


def _invalid(message: str) -> ProxyError:
    return ProxyError(400, INVALID_REQUEST, message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a token count


def _cap_output(body: dict[str, Any], ceiling: int, anthropic: bool) -> int:
    """Clamp the output-token fields to `ceiling` (at least 1), adding one where the body has none; the largest."""
    if anthropic:
        keys: tuple[str, ...] = ("max_tokens",)  # required by Anthropic anyway
    else:
        # Neither given: max_completion_tokens, since OpenAI's reasoning models reject max_tokens.
        keys = tuple(key for key in OPENAI_TOKEN_KEYS if key in body) or ("max_completion_tokens",)
    largest = 1
    for key in keys:
        requested = body.get(key, ceiling)
        if not _is_int(requested):
            raise _invalid(f"`{key}` must be an integer")
        capped: int = max(1, min(requested, ceiling))
        body[key] = capped
        largest = max(largest, capped)
    return largest


def _clamp_thinking(body: dict[str, Any]) -> None:
    """Anthropic's thinking budget counts within max_tokens and must stay below it."""
    thinking = body.get("thinking")
    if thinking is None:
        return
    if not isinstance(thinking, dict):
        raise _invalid("`thinking` must be an object")
    if "budget_tokens" not in thinking:
        return  # adaptive or disabled thinking: max_tokens bounds it
    budget = thinking["budget_tokens"]
    if not _is_int(budget):
        raise _invalid("`thinking.budget_tokens` must be an integer")
    body["thinking"] = {**thinking, "budget_tokens": min(budget, body["max_tokens"] - 1)}


def _keep_function_tools(body: dict[str, Any], anthropic: bool, dropped: list[str]) -> None:
    """Keep the tools the subagent runs itself; drop the ones the provider would run (search, fetch, code, MCP)."""
    tools = body.get("tools") or []  # a tool_choice without tools still goes below
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise _invalid("`tools` must be a list of objects")
    kept = []
    for tool in tools:
        kind = tool.get("type")
        if kind in (None, "custom") if anthropic else kind == "function":
            kept.append(tool)
        else:
            dropped.append(f"tools[{kind if isinstance(kind, str) else type(kind).__name__}]")
    if not kept:
        # An empty tools list, or a tool_choice without tools, is an error at both providers.
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            if key in body:
                del body[key]
                dropped.append(key)
        return
    body["tools"] = kept
    names = {name for tool in kept if isinstance(name := _tool_name(tool, anthropic), str)}
    if "tool_choice" in body and not _choice_allowed(body["tool_choice"], names, anthropic):
        del body["tool_choice"]
        dropped.append("tool_choice")


def _tool_name(tool: Mapping[str, Any], anthropic: bool) -> object:
    holder = tool if anthropic else tool.get("function")
    return holder.get("name") if isinstance(holder, Mapping) else None


def _choice_allowed(choice: object, names: set[str], anthropic: bool) -> bool:
    """A tool_choice survives unless it forces a tool that is not among the kept ones."""
    if not isinstance(choice, Mapping):
        return anthropic or isinstance(choice, str)  # OpenAI's "auto", "none", "required"
    if anthropic:
        return choice.get("type") != "tool" or _is_one_of(choice.get("name"), names)
    return choice.get("type") == "function" and _is_one_of(_tool_name(choice, anthropic=False), names)


def _is_one_of(name: object, names: set[str]) -> bool:
    return isinstance(name, str) and name in names  # a hostile name may be a list: unhashable


def objects(value: object, skip: Callable[[dict[str, Any]], bool] = lambda _: False) -> Iterator[dict[str, Any]]:
    """Every JSON object in `value`, at any depth, but inside those `skip` says to pass over (iterative: nesting is
    hostile too)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            yield item
            if not skip(item):
                stack.extend(item.values())


def _fetches_by_reference(value: object) -> bool:
    """True if any part makes the provider fetch a URL or read a stored file."""
    for item in objects(value):
        source, image = item.get("source"), item.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if (
            "file_id" in item
            or (isinstance(source, dict) and source.get("type") in ("url", "file"))
            or (image is not None and not (isinstance(url, str) and url.startswith("data:")))
        ):
            return True
    return False


def _labels(dropped: list[str]) -> tuple[str, ...]:
    labels = [label[:MAX_LABEL_CHARS] for label in dropped[:MAX_DROPPED_LABELS]]
    if len(dropped) > MAX_DROPPED_LABELS:
        labels.append(f"... and {len(dropped) - MAX_DROPPED_LABELS} more")
    return tuple(labels)


def parse_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 the container's SDK shows."""
    try:
        # Measured before it is parsed: 8 MB of `{}` would hold the GIL for seconds (runner/channel/bounded_json.py).
        bounded_json.check_shape(body, MAX_REQUEST_VALUES)
    except BodyRefused as exc:
        raise ProxyError(400, INVALID_REQUEST, f"request body refused: {exc}") from None
    try:
        # Not json.loads: a deeply nested body raises RecursionError there, an unhandled 500. This parser
        # stops at depth 200, far beyond any real request, and refuses NaN, which no provider takes as JSON.
        payload = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError:
        raise ProxyError(400, INVALID_REQUEST, "request body is not JSON (or nested too deeply)") from None
    if not isinstance(payload, dict):
        raise ProxyError(400, INVALID_REQUEST, "request body must be a JSON object")
    return payload


FOLLOWUP_INTRO = "Messages from the chat while you work (take them into account from now on):"


def with_followups(body: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The body with the chat's follow-ups as a last user message, the same for both APIs. The container
    does not keep them in its history, so every later request carries them again."""
    if not notes:
        return body
    text = "\n".join([FOLLOWUP_INTRO, *(f"- {note}" for note in notes)])
    return {**body, "messages": [*body["messages"], {"role": "user", "content": text}]}
