"""Build the main agent's pydantic-ai model from settings: openai-compatible, anthropic, or offline."""

from __future__ import annotations

from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from bot.agent.offline import offline_main_model
from core.settings import LLMProvider, Settings

LLM_MAX_RETRIES = 3  # 429s and 5xx are retried this often, with the SDK's backoff (honouring retry-after)


def build_main_model(settings: Settings) -> Model:
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    model_name = settings.llm_model or ""
    if settings.llm_provider is LLMProvider.OPENAI:
        # A local OpenAI-compatible server may need no key; the client insists on some string.
        client = AsyncOpenAI(base_url=settings.llm_base_url, api_key=key or "not-needed", max_retries=LLM_MAX_RETRIES)
        return OpenAIChatModel(model_name, provider=OpenAIProvider(openai_client=client))
    if settings.llm_provider is LLMProvider.ANTHROPIC:
        anthropic = AsyncAnthropic(api_key=key, base_url=settings.llm_base_url, max_retries=LLM_MAX_RETRIES)
        return AnthropicModel(model_name, provider=AnthropicProvider(anthropic_client=anthropic))
    return offline_main_model(settings.assistant_name)
