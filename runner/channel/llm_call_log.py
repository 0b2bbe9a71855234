"""The one log line per LLM call of a run (`llm_call`): its outcome, time and tokens, as operators read them."""

from __future__ import annotations

import time
from typing import Any

from core.logging import get_logger
from runner.channel.llm_usage import Usage


class CallLog:
    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._log = get_logger("runner.channel.llm_proxy")

    def call(
        self,
        run_id: str,
        path: str,
        status: int,
        usage: Usage | None,
        started: float,
        *,
        error: str | None = None,
        stream: bool = False,
    ) -> None:
        fields: dict[str, Any] = {
            "run_id": run_id,
            "path": path,
            "status": status,
            "duration_ms": round((time.monotonic() - started) * 1000),
            "provider": self._provider,
        }
        if usage is not None:
            fields.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        if stream:
            fields["stream"] = True
        if error is not None:
            fields["error"] = error
            self._log.warning("llm_call", **fields)
        else:
            self._log.info("llm_call", **fields)
