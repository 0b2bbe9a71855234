"""The group bucket of MessageRateLimiter counts edits with sends: a group's live edits, the outbox's final
edit, results and cards together stay within its 20 messages a minute; other calls pass unthrottled."""

from __future__ import annotations

import asyncio
from typing import Any

from bot.channels.telegram_limits import MessageRateLimiter

GROUP = -100123
NOT_HELD_SECONDS = 0.5  # a call the bucket does not hold answers far sooner than this


async def _call(limiter: MessageRateLimiter, endpoint: str, chat_id: int) -> None:
    async def callback() -> bool:
        return True

    data: dict[str, Any] = {"chat_id": chat_id}
    await asyncio.wait_for(limiter.process_request(callback, (), {}, endpoint, data, None), NOT_HELD_SECONDS)


async def test_edits_and_sends_to_one_group_share_its_bucket() -> None:
    limiter = MessageRateLimiter(overall_max_rate=0, group_max_rate=2, group_time_period=60, max_retries=0)
    await limiter.initialize()
    try:
        await _call(limiter, "sendMessage", GROUP)
        await _call(limiter, "editMessageText", GROUP)
        await _call(limiter, "getChatMember", GROUP)  # not a message: never held
        await _call(limiter, "editMessageText", GROUP - 1)  # another group has its own bucket
        held = asyncio.create_task(_call(limiter, "editMessageText", GROUP))
        await asyncio.wait([held])
        assert isinstance(held.exception(), TimeoutError)  # the group's third write in a minute waits
    finally:
        await limiter.shutdown()
