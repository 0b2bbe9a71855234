"""What a model request cancelled in flight counts (bot/agent/metered.py's stopped_usage): the provider's own
count when its final one came before the cancel; else its input count or the estimate, and the output
streamed so far, never less than what the provider said."""

from __future__ import annotations

from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.usage import RequestUsage

from bot.agent.metered import stopped_usage
from core.allowances import tokens_of_bytes

PROMPT = 900  # the request's input estimate, in tokens
SO_FAR = "Half an answer, streamed before the stop. " * 10


def partial(usage: RequestUsage, *, finished: bool = False) -> ModelResponse:
    return ModelResponse(parts=[TextPart(SO_FAR)], usage=usage, finish_reason="stop" if finished else None)


def test_a_request_cancelled_before_its_stream_began_counts_its_input_estimate() -> None:
    assert stopped_usage(PROMPT, None) == (PROMPT, 0, True)


def test_no_count_from_the_provider_counts_the_input_estimate_and_the_text_so_far() -> None:
    assert stopped_usage(PROMPT, partial(RequestUsage())) == (PROMPT, tokens_of_bytes(len(SO_FAR)), True)


def test_a_count_sent_at_the_streams_start_gives_the_input_and_bounds_the_output_below() -> None:
    started = RequestUsage(input_tokens=321, output_tokens=1)  # as Anthropic's message_start says
    assert stopped_usage(PROMPT, partial(started)) == (321, tokens_of_bytes(len(SO_FAR)), True)
    larger = RequestUsage(input_tokens=321, output_tokens=10_000)
    assert stopped_usage(PROMPT, partial(larger)) == (321, 10_000, True)


def test_the_providers_final_count_before_the_cancel_is_taken_as_it_is() -> None:
    final = RequestUsage(input_tokens=321, output_tokens=45)
    assert stopped_usage(PROMPT, partial(final, finished=True)) == (321, 45, False)
