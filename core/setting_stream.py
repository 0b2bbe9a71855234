"""Streamed replies (STREAM_*): how a growing answer is shown (bot/channels/live_message.py). `Settings` takes
these fields from `StreamSettings`, the MCP servers' from `McpSettings` and the subagent runtime's from
`RuntimeSettings` below it."""

from __future__ import annotations

from pydantic import Field

from core.setting_mcp import McpSettings

# Telegram answers 429 to a chat written to faster than about once a second, and allows a group about 20
# messages a minute (edits counted with them, bot/channels/telegram_limits.py): a group's growing answer is
# edited every 3 s by default, a private chat's draft every second.
MIN_STREAM_EDIT_INTERVAL_SECONDS = 1.0
MAX_STREAM_EDIT_INTERVAL_SECONDS = 30.0
DEFAULT_STREAM_EDIT_INTERVAL_SECONDS = 3.0  # 20 edits a minute: a group's whole budget while it streams
DEFAULT_STREAM_DRAFT_INTERVAL_SECONDS = 1.0
# Telegram allows a bot about 30 messages a second, all chats together; growing answers get at most 20 of
# them, so the outbox's sends and final edits, results and cards keep a third even while many chats stream.
MAX_STREAM_EDITS_PER_SECOND = 20.0
MIN_STREAM_EDITS_PER_SECOND = 1.0


class StreamSettings(McpSettings):
    # Replies written as they arrive: one message edited as it grows (drafts in private chats).
    stream_replies: bool = Field(default=True, alias="STREAM_REPLIES")
    stream_edit_interval_seconds: float = Field(
        default=DEFAULT_STREAM_EDIT_INTERVAL_SECONDS,
        ge=MIN_STREAM_EDIT_INTERVAL_SECONDS,
        le=MAX_STREAM_EDIT_INTERVAL_SECONDS,
        allow_inf_nan=False,
        alias="STREAM_EDIT_INTERVAL_SECONDS",
    )
    stream_draft_interval_seconds: float = Field(
        default=DEFAULT_STREAM_DRAFT_INTERVAL_SECONDS,
        ge=MIN_STREAM_EDIT_INTERVAL_SECONDS,
        le=MAX_STREAM_EDIT_INTERVAL_SECONDS,
        allow_inf_nan=False,
        alias="STREAM_DRAFT_INTERVAL_SECONDS",
    )
    stream_edits_per_second: float = Field(
        default=20.0,
        ge=MIN_STREAM_EDITS_PER_SECOND,
        le=MAX_STREAM_EDITS_PER_SECOND,
        allow_inf_nan=False,
        alias="STREAM_EDITS_PER_SECOND",
    )
