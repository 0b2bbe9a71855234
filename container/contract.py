"""The contract's plain part: mount points, paths and limits, in the standard library only.

The container's agent imports this and nothing heavier (it starts in tens of milliseconds); the host's
typed models of the same requests are in container/protocol.py.
"""

from __future__ import annotations

CHANNEL_DIR = "/crewbot/channel"
CHANNEL_SOCKET_FILE = "run.sock"
# The door to the web, beside the run socket when the operator allows egress: a container's loopback
# forwarder hands it each connection's bytes as they are (an HTTP proxy request, CONNECT for HTTPS).
EGRESS_SOCKET_FILE = "egress.sock"
WORKSPACE_DIR = "/workspace"
IPC_TASKS_DIR = "tasks"

# The run API on the channel. The LLM proxy serves the providers' own paths (/v1/chat/completions, /v1/messages).
TASK_PATH = "/run/task"
MESSAGE_PATH = "/run/message"
SESSION_PATH = "/run/session"
RESULT_PATH = "/run/result"
MODEL_PATH = "/run/model"  # one model request of the agent's loop, made by the host (runner/channel/model_step.py)
# Files: `GET /run/files/<index>` is the bytes of the task's offered file `index`; `POST /run/files` sends one
# file to the chat, as multipart/form-data: a `meta` part (FileMeta JSON), then a `file` part (the bytes).
FILES_PATH = "/run/files"
# `POST /run/ask`: a question for the chat (protocol.AskQuestion); the host answers once the chat has (an
# AskAnswer), or once nobody did in time or the run ends. One at a time; a retry with the same ask_id waits for
# the same question (a restart in between too).
ASK_PATH = "/run/ask"
# MCP tools (the operator's servers) are called by the host for the run: `POST /run/mcp` with a McpCall, answered
# with a ChannelAnswer whose detail is the tool's result as text. The container never reaches a server itself.
MCP_PATH = "/run/mcp"
MAX_MCP_TOOLS = 20  # offered to one run, besides its own tools (all within MAX_TOOLS)
MCP_CALL_WAIT_SECONDS = 660.0  # the longest a server's call may take (600 s) and the host's own bounds
RUN_API_PREFIX = "/run/"

ID_PATTERN = r"^[A-Za-z0-9_-]{6,64}$"
MAX_TASK_CHARS = 100_000
# The chat's notes a run is handed beside its task (kept out of its stored task and its saved session, so a note
# erased later, e.g. by /forgetme, leaves no copy behind).
MAX_NOTES_CHARS = 20_000
MAX_LABEL_CHARS = 200
MAX_PROGRESS_CHARS = 4_000  # one progress message: about one Telegram message
MAX_QUESTION_CHARS = 1_000  # ask_chat's question: a few lines in the chat
MAX_ASK_OPTIONS = 8  # ask_chat's options: one button each
MAX_OPTION_CHARS = 60  # an option, which is a button's label: a phone shows about this much
MAX_ANSWER_CHARS = 2_000  # a reply that answers a question, as the container gets it
MAX_RESULT_CHARS = 100_000  # on the wire; the host keeps less (runner.runs.outcome)
MAX_ERROR_CHARS = 4_000
MAX_SESSION_BYTES = 4 * 1024 * 1024  # a session upload; the host trims what it keeps
MAX_RUN_BODY_BYTES = 512 * 1024  # a message or a result, JSON-encoded
MAX_STEP_BYTES = 8 * 1024 * 1024  # a model step: the whole conversation so far, as the LLM proxy takes it
MAX_TOOLS = 32
MAX_TOOL_NAME_CHARS = 64
MAX_TOOL_DESCRIPTION_CHARS = 4_000
MAX_TOOL_SCHEMA_CHARS = 8_000  # a tool's argument schema as JSON

INBOX_DIR = "inbox"  # under the workspace: where the container writes the files the task offers it
MAX_FILE_NAME_BYTES = 255  # NAME_MAX: a safe file name fits one directory entry, in UTF-8
MAX_CAPTION_CHARS = 1_024  # Telegram's limit for a photo's or a document's caption
MAX_FILE_META_BYTES = 16 * 1024  # the `meta` part of a file upload: an id, a name and a caption, as JSON
MAX_OFFERED_FILES = 10  # files one run may be given
MAX_FILE_NOTES = 20  # lines saying which named files were not given to the run, and why
MAX_FILE_NOTE_CHARS = 300
MAX_EGRESS_ENTRIES = 200  # allowlist entries a task lists (the host's check uses all of them)

# Backends whose containers share no folder with the host (Kubernetes): the host starts `python -m
# container.bridge` inside the running container, which listens on the channel folder's sockets and carries
# each connection to the host over its own stdin and stdout (container/mux.py). Set in the container's
# environment by such a backend; nothing secret (the bridge's stream is the identity, as the socket is).
CHANNEL_BRIDGED_ENV = "CREWBOT_CHANNEL_BRIDGED"
BRIDGE_MODULE = "container.bridge"
BRIDGE_TARGET_RUN = "run"  # a connection to the run socket
BRIDGE_TARGET_EGRESS = "egress"  # a connection to the door to the web
# The same backends keep a chat's workspace on the host as one opaque archive (tar) the host never opens:
# `GET` it at the start into an empty /workspace, `PUT` it back before the result, up to WORKSPACE_QUOTA_MB.
WORKSPACE_SYNC_ENV = "CREWBOT_WORKSPACE_SYNC"
# A warm pool member (set to "1"): the agent imports everything, connects to its channel and waits for its task
# without a time limit, blocked in a read (no CPU while idle); the host answers once a run claims the container.
POOLED_ENV = "CREWBOT_POOLED"
WORKSPACE_PATH = "/run/workspace"
# A GET's answer names the archive it served (WORKSPACE_SERVED_HEADER: an id the host chose, SERVED_ID_PATTERN).
# A run that cannot unpack it says so with `POST` (protocol.UnreadableWorkspace: that id, and why, in at most
# MAX_UNREADABLE_REASON_CHARS): the host sets that archive aside, so no later run is served it.
WORKSPACE_SERVED_HEADER = "X-Crewbot-Workspace-Served"
# Two runs of one chat at once each push: a GET's answer (200 or 204) names the stored archive's version
# (WORKSPACE_VERSION_HEADER, VERSION_PATTERN; EMPTY_VERSION: the chat has none), a PUT names the version it was based
# on (WORKSPACE_BASE_HEADER), and the host keeps it only if that is still the chat's; else it answers
# WORKSPACE_STALE_STATUS, keeping the newer archive, and the run takes that one's changes under its own and pushes
# again (container/workspace_rebase.py). A PUT without a base replaces whatever is stored (an agent from before).
WORKSPACE_VERSION_HEADER = "X-Crewbot-Workspace-Version"
WORKSPACE_BASE_HEADER = "X-Crewbot-Workspace-Base"
VERSION_PATTERN = r"^[0-9a-f]{32}$"
EMPTY_VERSION = "0" * 32
WORKSPACE_STALE_STATUS = 412  # Precondition Failed: the base named is no longer the chat's archive
# A run's push found stale this many times more is given up. Each other run of the chat that saves meanwhile makes
# it stale once, and up to MAX_SUBAGENTS_PER_CHAT run at once (at most its ceiling, 100: core/settings.py, which
# the container does not import); the host lets a run pull and push this many times more than its few retries.
MAX_WORKSPACE_REBASES = 100
SERVED_ID_PATTERN = r"^[0-9a-f]{16}$"
MAX_UNREADABLE_REASON_CHARS = 500
