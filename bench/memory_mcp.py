"""Host memory with an MCP server configured for every chat: bench/memory.py's 1,000 chats, each turn offered the
server's tools, in a worker process of its own (its peak is this process's). The MCP SDK's client is loaded by the
first turn that offers a server's tools, so an operator who configures none never holds it."""

from __future__ import annotations

from bench.common import BenchContext
from bench.memory import burst_rows
from bench.report import Row
from bench.tg_process import TelegramProcess

NAME = "memory_mcp"


async def run(ctx: BenchContext) -> list[Row]:
    async with TelegramProcess() as tg:
        return await burst_rows(ctx, tg, NAME, mcp=True)
