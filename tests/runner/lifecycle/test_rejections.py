"""Refusals that arrive together are told in one notice per chat; later ones get their own."""

from __future__ import annotations

import asyncio

from runner.lifecycle.rejections import RejectionNotices


async def test_a_burst_becomes_one_notice_per_chat() -> None:
    sent: list[tuple[int, int]] = []

    async def send(chat_id: int, count: int) -> None:
        sent.append((chat_id, count))

    notices = RejectionNotices(send, window_seconds=0.05)
    for _ in range(7):
        notices.add(1)
    notices.add(2)
    await asyncio.sleep(0.2)
    assert sorted(sent) == [(1, 7), (2, 1)]
    notices.add(1)
    await asyncio.sleep(0.2)
    assert sent[-1] == (1, 1)


async def test_close_tells_what_is_still_owed_at_once() -> None:
    sent: list[tuple[int, int]] = []

    async def send(chat_id: int, count: int) -> None:
        sent.append((chat_id, count))

    notices = RejectionNotices(send, window_seconds=60)
    notices.add(5)
    notices.add(5)
    await notices.close()
    assert sent == [(5, 2)]
