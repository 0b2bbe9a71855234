"""What each setting means, in the operator's words, grouped as docs/settings.md lists them.

docs/settings.md is generated from these texts and the `Settings` model (name, type, default, range, whether it
changes live: crewbot/settings_reference.py); tests/test_settings_reference.py fails when a setting has no text
here, a text names no setting, or the page differs from what the model gives. The ranges and "changeable live"
are not written here: the reference takes them from the model and core/live_config.py.
"""

from __future__ import annotations

SETTING_GROUPS: tuple[tuple[str, dict[str, str]], ...] = (
    (
        "Telegram",
        {
            "TELEGRAM_BOT_TOKEN": "The bot's token, from @BotFather. None: `make run` opens the console.",
            "TELEGRAM_API_BASE_URL": "The Bot API's base (a local Bot API server, or a test fake); files are "
            "served at its `…/file/bot` sibling.",
            "TELEGRAM_WEBHOOK_URL": "Webhook mode: the public `https://` URL Telegram POSTs updates to (port 443, "
            "80, 88 or 8443), served by a reverse proxy in front of `TELEGRAM_WEBHOOK_LISTEN` (`deploy/Caddyfile`, "
            "`deploy/nginx-webhook.conf`); set with setWebhook at start. None: long polling, which deletes a "
            "webhook left set (nothing pending is lost).",
            "TELEGRAM_WEBHOOK_LISTEN": "Where the bot listens for the proxy in webhook mode (`HOST:PORT`); it "
            "serves the URL's path there, POST only.",
            "TELEGRAM_WEBHOOK_SECRET": "Required with `TELEGRAM_WEBHOOK_URL`: 16 to 256 letters, digits, `_` or "
            "`-` (e.g. `openssl rand -hex 32`). Telegram sends it with every update; anything without it is "
            "refused (403).",
            "ALLOWED_CHAT_IDS": "Chats the bot works in, comma-separated (`-1001234567890,42`) or a JSON list; "
            "others are ignored. `/start` in a chat tells its id.",
            "ALLOW_ALL_CHATS": "Work in every chat.",
            "ADMIN_USER_IDS": "Users allowed the admin commands (`/cancel`, `/stop`, `/workspace clear`, "
            "`/budget set`, …) in every chat, besides each chat's admins, and the only ones allowed `/config`; "
            "comma-separated or a JSON list.",
            "ASSISTANT_NAME": "The reply prefix and the name the prompt uses.",
        },
    ),
    (
        "The LLM",
        {
            "LLM_PROVIDER": "`openai` (any OpenAI-compatible server), `anthropic`, or `offline` (the demo "
            "model, no key needed).",
            "LLM_BASE_URL": "The provider's endpoint; none: the provider's own. For an OpenAI-compatible server "
            "it ends where the API starts, usually `/v1`.",
            "LLM_API_KEY": "The provider's key; it never enters a container.",
            "LLM_MODEL": "The main agent's model (required for `openai` and `anthropic`).",
            "LLM_TIMEOUT_SECONDS": "A turn waits this long for the LLM, then apologises.",
            "SUBAGENT_MODEL": "The subagents' model; none: `LLM_MODEL`.",
            "HISTORY_WINDOW_MESSAGES": "Messages of the chat's history in each prompt.",
        },
    ),
    (
        "Images and voice",
        {
            "LLM_VISION": "Show the main agent the images posted in its window (photos, image documents, stickers): "
            "`auto` when the model is of a known vision family (GPT-4o/4.1/5, o1/o3/o4, Claude 3+, Gemini, LLaVA, "
            "Qwen-VL, Pixtral, …; `crewbot doctor` says), `on` for any other, or `off`. A provider that refuses a "
            "request's images gets the turn again without them; the model is shown none until the bot restarts "
            "only when the provider says it takes no images, or refuses them in two different chats (a "
            "content-policy refusal costs only its turn).",
            "VISION_MAX_IMAGES": "The newest images of the window shown to the model, each downscaled to at most "
            "1,568 px on its long side (`0`: none).",
            "STT_BASE_URL": "Voice notes, audio files and video notes are transcribed by this OpenAI-compatible API "
            "base (the bot POSTs `{STT_BASE_URL}/audio/transcriptions`), e.g. `https://api.openai.com/v1`, Groq's, "
            "or a local whisper server; none: nothing is transcribed.",
            "STT_API_KEY": "The speech-to-text service's key, sent as a bearer token; none: no `Authorization`.",
            "STT_MODEL": "The transcription model (`whisper-1`, `gpt-4o-mini-transcribe`, `whisper-large-v3`, …).",
            "STT_MAX_SECONDS": "Longer audio is not transcribed (its line in the chat's history says so). The "
            "length is computed from the file's bytes (Ogg by its packets, WAV by its samples, M4A and video notes "
            "by their sample tables); an MP3's is bounded by its size at 8 kbit/s: 300 admits an MP3 of up to 300 "
            "KB. Other formats (WebM, FLAC, AAC, AMR) are refused.",
            "STT_LANGUAGE": "The language spoken (ISO-639, e.g. `en`, `pt-BR`); none: the service detects it.",
            "STT_PRICE_PER_MINUTE": "What a minute of transcribed audio costs, in the currency of the LLM prices: "
            "`/budget` and `crewbot stats` show it, and the allowances count it as the main model's input tokens "
            "that money buys (`LLM_PRICE_INPUT_PER_MTOK`).",
        },
    ),
    (
        "Memory",
        {
            "MEMORY_MAX_NOTES": "Notes a chat keeps (`remember`); past it, one must be forgotten before another "
            "is kept.",
            "MEMORY_MAX_MEMBER_NOTES": "Notes about each member, in each chat (`remember_about`).",
            "MEMORY_NOTE_CHARS": "The longest note, in characters; a longer one is refused, never cut.",
            "MEMORY_PROMPT_CHARS": "Characters of notes in each prompt (about 4 a token), newest first; older "
            "ones are listed by `/memory`.",
            "HISTORY_SEARCH_RESULTS": "Messages one `search_history` call returns at most, each as a snippet "
            "with its date, author and id.",
        },
    ),
    (
        "Turns and results",
        {
            "MERGE_WINDOW_SECONDS": "A message this soon after a turn started aborts it, and one new answer "
            "covers both.",
            "MERGE_CANCEL_SCOPE": "On such an abort, cancel that turn's subagents (`turn`) or all of the chat's "
            "(`chat`).",
            "MAX_CONCURRENT_TURNS": "Main-agent turns at once, all chats together. A chat over it shows *typing* "
            "and waits for a turn to end; what its members write meanwhile is answered together, and `/stop` "
            "drops it. Each turn holds its prompt, model run and growing answer in the bot's memory and one LLM "
            "request.",
            "TYPING_INTERVAL_SECONDS": "How often *typing* is sent again while something runs for the chat.",
            "STREAM_REPLIES": "Show the main agent's answer as it is written: one message edited as it grows "
            "(a draft in private chats), with a Stop button. Off: the whole answer is sent at once.",
            "STREAM_EDIT_INTERVAL_SECONDS": "The least time between two edits of one group's growing answer "
            "(Telegram allows a group about 20 messages a minute, edits included: 3 s uses all of it); longer "
            "when many chats stream at once (`STREAM_EDITS_PER_SECOND`), and doubled for a while in a chat "
            "Telegram answered 429 (up to 30 s, back over minutes).",
            "STREAM_DRAFT_INTERVAL_SECONDS": "The least time between two updates of a private chat's draft "
            "(its growing answer); longer when many chats stream at once, and after a 429 as for groups.",
            "STREAM_EDITS_PER_SECOND": "Edits of growing answers per second, all chats together. Telegram "
            "allows a bot about 30 messages a second; at most 20 go to growing answers, so final texts, results "
            "and cards keep room while many chats stream.",
            "SUBAGENT_RESULT_MODE": "`direct`: a finished run's result is sent as its own `[Subagent]` message; "
            "`announce`: the result (status, result, usage) is handed to the main agent as a new turn, which "
            "tells the chat in its own words or stays silent. The raw result is stored as `[Subagent]` for the "
            "next prompt either way.",
            "STATUS_CARD": "The first subagent of a turn posts one status message (a reply to the bot's answer) "
            "listing that turn's runs with state, elapsed time and tokens, edited in place as they change (at "
            "most every 3 s per chat) and ending with the totals; `false`: none.",
            "SUBAGENT_REJECT_MESSAGE": "What a chat is told when spawns are over a cap; refusals within a second "
            "are told in one message. Placeholders: `{running}`, `{limit}`, `{chat_running}`, `{chat_limit}`, "
            "`{count}`, `{not_started}`.",
        },
    ),
    (
        "Subagents: caps and limits",
        {
            "MAX_CONCURRENT_SUBAGENTS": "Subagent containers at once, all chats together.",
            "MAX_SUBAGENTS_PER_CHAT": "The same, per chat.",
            "SUBAGENT_QUEUE_LIMIT": "Spawn requests over a cap wait in a queue this long (all chats together; "
            "one chat at most half), fair across chats, and start as slots free; beyond it they are refused; "
            "`0` refuses at once.",
            "SUBAGENT_TIMEOUT_SECONDS": "The wall-clock limit of one subagent; then it is killed and reported.",
            "SUBAGENT_APPROVAL": "`off`: a spawned run starts as soon as the caps allow. `admins`: it waits on the "
            "status card as *awaiting approval* until a chat admin (or one in `ADMIN_USER_IDS`) taps Approve; Deny, "
            "or no answer within `SUBAGENT_ASK_TIMEOUT_SECONDS`, refuses it. Waiting runs count against "
            "`SUBAGENT_QUEUE_LIMIT`; a scheduled task is approved once, at its creation, by an admin.",
            "SUBAGENT_ASK_TIMEOUT_SECONDS": "How long a question to the chat waits for its answer (a subagent's "
            "`ask_chat`, a host in `SUBAGENT_EGRESS=ask` mode, an approval); the wait counts against the run's "
            "time limit, and no answer is a no.",
            "SUBAGENT_MAX_QUESTIONS": "Questions one run may ask the chat (`ask_chat` and web hosts together); "
            "one at a time.",
            "SUBAGENT_MEMORY": "A container's memory limit as Docker writes it (digits and `b`, `k`, `m` or `g`), "
            "from `6m` to this host's memory.",
            "SUBAGENT_CPUS": "A container's CPU limit, in cores.",
            "SUBAGENT_PIDS": "Processes (and threads) one container may hold.",
            "SUBAGENT_WARM_POOL": "Containers kept started ahead, each with its agent waiting for one run (`0`: "
            "none). A run takes a ready one and skips the container's start; after its run a container is removed, "
            "never reused. With a pool, a chat whose workspace is empty when a run starts is then kept as an archive "
            "its runs fetch and save over the channel (pool or not, from then on); a chat whose workspace folder "
            "holds files keeps it mounted and is never pooled, until an admin's /workspace clear "
            "(docs/operating.md). Two synced runs of one chat at once both keep their files (the later push merges "
            "onto the earlier in its container). Read at start. The default `2` suits a 2-core host (an idle member "
            "holds about 14 MiB on Docker, 26 MiB as a pod).",
            "SUBAGENT_MAX_TOKENS": "LLM tokens (input and output) one run may use; over it the proxy refuses and "
            "the run ends with that message.",
            "SUBAGENT_MAX_MESSAGES": "Progress messages one run may send to its chat (the result is not counted).",
            "SUBAGENT_SESSION_MAX_MESSAGES": "Messages of a subagent's history kept for the chat's next run "
            "(`0`: none).",
            "WORKSPACE_QUOTA_MB": "Disk space of one chat's workspace, measured; over it a run ends (or does not "
            "start) and the chat is told how to clear it.",
            "SUBAGENT_ALLOW_PROVIDER_TOOLS": "Let subagents use a provider's server-side tools (web search, MCP, "
            "code execution) and beta headers.",
        },
    ),
    (
        "Where subagents run",
        {
            "SUBAGENT_IMAGE": "The image of subagent containers.",
            "SUBAGENT_NETWORK": "Their Docker network mode (`host` only to reach a local model server).",
            "SUBAGENT_IMAGE_PACKAGES": "pip requirements baked into the subagent image by `crewbot image build`, "
            "separated by blanks (`pandas matplotlib pypdf`); fetched on the host, never by a container.",
            "SUBAGENT_IMAGE_APT": "Debian packages baked into the subagent image the same way (`poppler-utils git`).",
            "SUBAGENT_RUNTIME": "Where subagents run: `docker` (the local engine) or `kubernetes` (one Job per "
            "run in a cluster; see [Kubernetes and gVisor](kubernetes.md)).",
            "SUBAGENT_RUNTIME_CLASS": "A second kernel boundary: Docker's `--runtime` (`runsc`, gVisor, "
            "registered by `make engine`) or Kubernetes' `runtimeClassName` (e.g. `gvisor`); none: the engine's "
            "default.",
            "KUBE_NAMESPACE": "Kubernetes: the runs' namespace; none: the bot's own when it runs in the cluster, "
            "else the kubeconfig context's, else `default`.",
            "KUBECONFIG": "Kubernetes: the kubeconfig file; none: the pod's service account when the bot runs in "
            "the cluster, else `~/.kube/config`.",
            "KUBE_IMAGE_PULL_POLICY": "Kubernetes: `Always`, `IfNotPresent` or `Never` for `SUBAGENT_IMAGE`.",
            "KUBE_JOB_TTL_SECONDS": "Kubernetes: how long the cluster keeps a finished Job the bot could not "
            "delete itself (`ttlSecondsAfterFinished`).",
        },
    ),
    (
        "Files",
        {
            "SUBAGENT_MAX_FILE_MB": "One file a run is given or sends, in MB (Telegram hands bots files up to 20 MB).",
            "SUBAGENT_MAX_FILES": "Files one run may send to its chat with `send_file`.",
            "SUBAGENT_RUN_FILES_MB": "The chat's files one run is given, all together, in MB.",
        },
    ),
    (
        "The web",
        {
            "SUBAGENT_EGRESS": "The web for subagents: `none` (no network), `allowlist` (only "
            "`SUBAGENT_EGRESS_ALLOW`), `ask` (the allowlist and the chat's own list, plus a question to the chat's "
            "admins for any other public host: Allow once, Allow in this chat, Deny), `open` (any public "
            "address); through a proxy on the host (see [Files and the web](files-and-web.md#subagents-and-the-web)).",
            "SUBAGENT_EGRESS_ALLOW": "Hosts subagents may reach in `allowlist` mode, comma-separated or a JSON "
            "list: `pypi.org`, `*.wikipedia.org` (names under it), `api.github.com:443` (one port; without one: "
            "80 and 443), `127.0.0.1:8080` (an address, the only way to reach a private one).",
            "SUBAGENT_EGRESS_MAX_MB": "Bytes one run may move through the door, both ways, in MB; over it its "
            "connections are cut.",
            "SUBAGENT_EGRESS_MAX_CONNECTIONS": "Connections one run holds through the door at once.",
        },
    ),
    (
        "MCP servers",
        {
            "MCP_SERVERS": "The JSON file of the operator's MCP servers, in the `mcpServers` format (see "
            "[MCP servers](mcp.md)); read again when it changes (at the next turn or run). None: no servers.",
            "SUBAGENT_MCP_MAX_CALLS": "MCP tool calls one subagent run may make through the host; more are "
            "refused (`0`: none).",
            "SUBAGENT_MCP_MAX_RESULT_MB": "Bytes of MCP tool results one subagent run may be given, in MB, all "
            "calls together; later calls are refused.",
        },
    ),
    (
        "Allowances and prices",
        {
            "CHAT_DAILY_TOKENS": "LLM tokens one chat may use a day: main agent, announcements, subagents and "
            "scheduled runs together (`0`: no allowance); an admin may set a chat's own with `/budget set`.",
            "DAILY_TOKENS": "The same for all chats together (`0`: no allowance).",
            "LLM_PRICE_INPUT_PER_MTOK": "The main model's price per million input tokens, to show spend in money.",
            "LLM_PRICE_OUTPUT_PER_MTOK": "The main model's price per million output tokens.",
            "SUBAGENT_PRICE_INPUT_PER_MTOK": "The subagents' model's price per million input tokens; none: the "
            "main model's.",
            "SUBAGENT_PRICE_OUTPUT_PER_MTOK": "The subagents' model's price per million output tokens; none: the "
            "main model's.",
        },
    ),
    (
        "Scheduled tasks",
        {
            "TIMEZONE": "The IANA time zone schedules are read in (and the day of the allowances), unless a chat "
            "sets its own with `/timezone`.",
            "SCHEDULE_MIN_INTERVAL_SECONDS": "Scheduled tasks may not come due more often than this.",
            "SCHEDULE_MISFIRE_GRACE_SECONDS": "A due time missed while the bot was down still runs (once) at start "
            "if it is at most this late; else it is skipped and the task's history says so.",
            "SCHEDULE_MAX_FAILURES": "A scheduled task that fails this many times in a row is paused and the chat "
            "is told.",
            "MAX_TASKS_PER_CHAT": "Active and paused scheduled tasks one chat may have (a forum's topics share "
            "one count).",
        },
    ),
    (
        "Data, IPC, metrics and logs",
        {
            "DATA_DIR": "The database, IPC folders, workspaces, run folders and logs; made private to its owner "
            "(0700) at start.",
            "DATA_RETENTION_DAYS": "Finished runs' logs, quarantined IPC files, unused sessions, bulky run text, "
            "copies of chat files no run used for this long, copies of sent files (their records stay), "
            "streamed answers' figures and MCP tool calls' rows (`crewbot stats`), posted images prepared for the "
            "model and not shown for this long, and transcripts' words older than this are pruned.",
            "IPC_FORCE_POLLING": "Poll the IPC folders instead of inotify (file systems without events).",
            "IPC_RESCAN_SECONDS": "A full rescan of the IPC folders, a safety net under inotify.",
            "IPC_MAX_FILE_BYTES": "Larger IPC files are quarantined.",
            "METRICS_ADDR": "`HOST:PORT` (e.g. `127.0.0.1:9464`) for Prometheus `/metrics`, `/healthz` and "
            "`/readyz` (see [Metrics and health](operating.md#metrics-and-health)); none: off.",
            "LOG_FORMAT": "`console`, or `json` (one object a line) for production; tokens and keys never appear "
            "in logs.",
            "LOG_LEVEL": "`DEBUG`, `INFO`, `WARNING`, `ERROR` or `CRITICAL`.",
        },
    ),
)
