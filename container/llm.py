"""The subagent's model: the provider's SDK pointed at the host's LLM proxy over a Unix socket.

The container holds no API key: the proxy behind the socket adds it. The SDKs insist on a key and a
host name, so they get placeholders that the proxy ignores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
from pydantic_ai.models import Model

from container.protocol import TaskSpec

PROXY_ORIGIN = "http://llm"  # any host: the transport goes to the socket
PLACEHOLDER_API_KEY = "unused"
LLM_REQUEST_TIMEOUT_SECONDS = 600.0
LLM_CONNECT_TIMEOUT_SECONDS = 10.0
# The SDK retries a failed request once; more would hide a broken provider behind minutes of back-off.
LLM_SDK_MAX_RETRIES = 1
# Connecting is retried apart from that, after 0, 0.5, 1, 2, 4, 8 and 16 s (about 30 s in all): the
# socket is missing or refuses while the host restarts, and the run must outlive a normal restart.
LLM_CONNECT_RETRIES = 7
LLM_MAX_CONNECTIONS = 4  # with the channel's 4, well under the host's 16 a run (container/channel.py)


@asynccontextmanager
async def open_model(
    task: TaskSpec, socket_path: Path, transport: httpx2.AsyncBaseTransport | None = None
) -> AsyncIterator[Model]:
    """The model `task` asks for, talking to the proxy on `socket_path` (or through `transport`: the host
    uses one to learn the run's first request); closes the connection after."""
    timeout = httpx2.Timeout(LLM_REQUEST_TIMEOUT_SECONDS, connect=LLM_CONNECT_TIMEOUT_SECONDS)
    if transport is None:
        transport = httpx2.AsyncHTTPTransport(
            uds=str(socket_path), retries=LLM_CONNECT_RETRIES, limits=httpx2.Limits(max_connections=LLM_MAX_CONNECTIONS)
        )
    async with httpx2.AsyncClient(transport=transport, timeout=timeout) as http_client:
        yield _build_model(task, http_client, timeout)


def _build_model(task: TaskSpec, http_client: httpx2.AsyncClient, timeout: httpx2.Timeout) -> Model:
    # Each SDK is imported only when used: importing both adds seconds to every container start.
    if task.provider_kind == "anthropic":
        from anthropic import AsyncAnthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        anthropic_client = AsyncAnthropic(
            api_key=PLACEHOLDER_API_KEY,
            base_url=PROXY_ORIGIN,
            http_client=http_client,
            timeout=timeout,
            max_retries=LLM_SDK_MAX_RETRIES,
        )
        return AnthropicModel(task.model, provider=AnthropicProvider(anthropic_client=anthropic_client))

    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    openai_client = AsyncOpenAI(
        api_key=PLACEHOLDER_API_KEY,
        base_url=f"{PROXY_ORIGIN}/v1",
        http_client=http_client,
        timeout=timeout,
        max_retries=LLM_SDK_MAX_RETRIES,
    )
    return OpenAIChatModel(task.model, provider=OpenAIProvider(openai_client=openai_client))
