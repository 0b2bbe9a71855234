"""Build the main agent's pydantic-ai model from settings: openai-compatible, anthropic, or offline."""

from __future__ import annotations

from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from bot.agent.offline import offline_main_model
from bot.settings import LLMProvider, Settings


def build_main_model(settings: Settings) -> Model:
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    model_name = settings.llm_model or ""
    if settings.llm_provider is LLMProvider.OPENAI:
        # A local OpenAI-compatible server may need no key; the client insists on some string.
        provider = OpenAIProvider(base_url=settings.llm_base_url, api_key=key or "not-needed")
        return OpenAIChatModel(model_name, provider=provider)
    if settings.llm_provider is LLMProvider.ANTHROPIC:
        provider_a = AnthropicProvider(api_key=key, base_url=settings.llm_base_url)
        return AnthropicModel(model_name, provider=provider_a)
    return offline_main_model(settings.assistant_name)
