"""The operator's MCP servers (MCP_SERVERS and the per-run limits of subagents' tool calls). `Settings` takes
these fields from `McpSettings`, through `StreamSettings` above it; the file's format is core/mcp_config.py's."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from core.setting_runtime import RuntimeSettings

MAX_SUBAGENT_MCP_CALLS = 10_000
MAX_SUBAGENT_MCP_RESULT_MB = 100


class McpSettings(RuntimeSettings):
    mcp_servers: Path | None = Field(default=None, alias="MCP_SERVERS")
    subagent_mcp_max_calls: int = Field(default=100, ge=0, le=MAX_SUBAGENT_MCP_CALLS, alias="SUBAGENT_MCP_MAX_CALLS")
    subagent_mcp_max_result_mb: float = Field(
        default=5.0, ge=0.0, le=MAX_SUBAGENT_MCP_RESULT_MB, allow_inf_nan=False, alias="SUBAGENT_MCP_MAX_RESULT_MB"
    )

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _blank_mcp_servers(cls, value: object) -> object:
        """`MCP_SERVERS=` (as .env.example has it): no servers, not the current directory."""
        return None if isinstance(value, str) and not value.strip() else value
