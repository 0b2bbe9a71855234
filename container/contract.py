"""The contract's plain part: mount points, paths and limits, in the standard library only.

The container's agent imports this and nothing heavier (it starts in tens of milliseconds); the host's
typed models of the same requests are in container/protocol.py.
"""

from __future__ import annotations

CHANNEL_DIR = "/crewbot/channel"
CHANNEL_SOCKET_FILE = "run.sock"
WORKSPACE_DIR = "/workspace"
IPC_TASKS_DIR = "tasks"

# The run API on the channel. The LLM proxy serves the providers' own paths (/v1/chat/completions, /v1/messages).
TASK_PATH = "/run/task"
MESSAGE_PATH = "/run/message"
SESSION_PATH = "/run/session"
RESULT_PATH = "/run/result"
MODEL_PATH = "/run/model"  # one model request of the agent's loop, made by the host (runner/channel/model_step.py)
RUN_API_PREFIX = "/run/"

ID_PATTERN = r"^[A-Za-z0-9_-]{6,64}$"
MAX_TASK_CHARS = 100_000
MAX_LABEL_CHARS = 200
MAX_PROGRESS_CHARS = 4_000  # one progress message: about one Telegram message
MAX_RESULT_CHARS = 100_000  # on the wire; the host keeps less (runner.runs.outcome)
MAX_ERROR_CHARS = 4_000
MAX_SESSION_BYTES = 4 * 1024 * 1024  # a session upload; the host trims what it keeps
MAX_RUN_BODY_BYTES = 512 * 1024  # a message or a result, JSON-encoded
MAX_STEP_BYTES = 8 * 1024 * 1024  # a model step: the whole conversation so far, as the LLM proxy takes it
MAX_TOOLS = 32
MAX_TOOL_NAME_CHARS = 64
MAX_TOOL_DESCRIPTION_CHARS = 4_000
MAX_TOOL_SCHEMA_CHARS = 8_000  # a tool's argument schema as JSON
