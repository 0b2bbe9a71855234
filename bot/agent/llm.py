"""Build the main agent's pydantic-ai model from settings: openai-compatible, anthropic, or offline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.settings import LLMProvider, Settings

if TYPE_CHECKING:
    from pydantic_ai.models import Model

LLM_MAX_RETRIES = 3  # 429s and 5xx are retried this often, with the SDK's backoff (honouring retry-after)


def build_main_model(settings: Settings) -> Model:
    """Called on the main agent's first turn (bot/agent/main_agent.py), not at start."""
    # Each provider's SDK is imported only when it is the configured one: the anthropic SDK alone is
    # about 3,000 modules and 50 MiB of the process, which a bot on another provider never uses.
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    model_name = settings.llm_model or ""
    if settings.llm_provider is LLMProvider.OPENAI:
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        # A local OpenAI-compatible server may need no key; the client insists on some string.
        client = AsyncOpenAI(base_url=settings.llm_base_url, api_key=key or "not-needed", max_retries=LLM_MAX_RETRIES)
        return OpenAIChatModel(model_name, provider=OpenAIProvider(openai_client=client))
    if settings.llm_provider is LLMProvider.ANTHROPIC:
        from anthropic import AsyncAnthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        anthropic = AsyncAnthropic(api_key=key, base_url=settings.llm_base_url, max_retries=LLM_MAX_RETRIES)
        return AnthropicModel(model_name, provider=AnthropicProvider(anthropic_client=anthropic))
    from bot.agent.offline import offline_main_model

    return offline_main_model(settings.assistant_name)
