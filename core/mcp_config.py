"""The operator's MCP servers: the `MCP_SERVERS` file in the `mcpServers` format (Claude Desktop, Cursor, VS Code),
read, checked and resolved against the bot's environment.

`{"mcpServers": {"NAME": {"command": …, "args": […], "env": {…}}}}` starts a stdio server on the host;
`{"url": …, "headers": {…}}` speaks streamable HTTP. crewbot's own keys per server: `tools` (an allowlist; all
when absent), `use` (`["main"]` by default; `"subagents"` offers the tools to subagents through the host),
`chats` (chat ids; all when absent) and `timeout_seconds`. Keys the other tools write (`type`, `disabled`,
`autoApprove`, …) are accepted; `"disabled": true` leaves a server out.

Where a secret may be (docs/mcp.md): only in `env` (stdio) and `headers` (HTTP), literally or as `${VAR}` read
from the bot's environment or its `.env` file (as the settings are). `command`, `args` and `url` are shown in
process lists, logs and `/tools`: a `${VAR}` there, a URL with a user or password, a secret-named query
parameter, or an argument such as `--token=…` is refused with one line naming the server and the key.
"""

from __future__ import annotations

import json
import os
import re
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

MAX_CONFIG_BYTES = 1024 * 1024  # a config file bigger than this is not one an operator wrote
MAX_SERVERS = 64
MAX_SERVER_NAME_CHARS = 32
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")  # a tool's prefix: `<name>__<tool>` fits the LLMs' tool names
MIN_TIMEOUT_SECONDS = 1.0
MAX_TIMEOUT_SECONDS = 600.0
DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_ALLOWED_TOOLS = 1_000
MAX_CHATS = 10_000
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ANY_REFERENCE = re.compile(r"\$\{")
# A query parameter or a command-line option with one of these words in its name carries a secret.
_SECRET_WORD = re.compile(
    r"(token|secret|passw|api[-_]?key|apikey|credential|private[-_]?key|authorization|bearer|^auth$|^key$|^sig$)", re.I
)
_NAMES_A_PLACE = re.compile(r"[-_.](file|path|env|dir|var)$", re.I)  # `--token-file PATH` holds no secret
_OPTION = re.compile(r"^--?([A-Za-z0-9][A-Za-z0-9_.-]*)(=(.*))?$", re.S)
_HEADER_ARG = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*:\s*\S")  # `Authorization: Bearer …` (mcp-remote --header)
_ASSIGNMENT_ARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=\S")  # `GITHUB_TOKEN=…` (`env NAME=VALUE server`)
_CREDENTIAL_SCHEME = re.compile(r"^(bearer|basic|token)\s+\S", re.I)
_IGNORED_KEYS = frozenset({"type", "disabled", "autoApprove", "alwaysAllow", "cwd", "description", "transport"})
_STDIO_KEYS = frozenset({"command", "args", "env"})
_HTTP_KEYS = frozenset({"url", "headers"})
_CREWBOT_KEYS = frozenset({"tools", "use", "chats", "timeout_seconds"})


class McpConfigError(ValueError):
    """The file cannot be used; the message is one line naming the server and the key."""


class Transport(StrEnum):
    STDIO = "stdio"
    HTTP = "http"  # streamable HTTP


class Use(StrEnum):
    MAIN = "main"  # the main agent's tools
    SUBAGENTS = "subagents"  # offered to subagents, called by the host


@dataclass(frozen=True, slots=True)
class McpServer:
    """One server, its secrets resolved: `env` and `headers` hold what authenticates and stay on the host."""

    name: str
    transport: Transport
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str = ""
    headers: Mapping[str, str] | None = None
    tools: frozenset[str] | None = None  # None: every tool the server lists
    use: frozenset[Use] = frozenset({Use.MAIN})
    chats: frozenset[int] | None = None  # None: every allowed chat
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    def serves_chat(self, chat_id: int) -> bool:
        return self.chats is None or chat_id in self.chats

    def allows_tool(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    @property
    def where(self) -> str:
        """What the operator recognises the server by, with nothing secret: the command line or the URL."""
        return " ".join((self.command, *self.args)) if self.transport is Transport.STDIO else self.url

    @property
    def secret_values(self) -> tuple[str, ...]:
        """Every value of `env` and `headers`: redacted from what a server's errors say."""
        values = [*(self.env or {}).values(), *(self.headers or {}).values()]
        plain = [v for value in values for v in (value, *value.split()) if len(v) >= MIN_REDACTED_CHARS]
        # A server that echoes a token tends to echo it as it travels: URL-encoded (a query) or base64 (Basic auth).
        encoded = [form for v in plain for form in (quote(v, safe=""), quote_plus(v), b64encode(v.encode()).decode())]
        return tuple(dict.fromkeys(sorted([*plain, *encoded], key=len, reverse=True)))


MIN_REDACTED_CHARS = 6  # shorter values (`1`, `true`) are not redacted: they would blank every number


@dataclass(frozen=True, slots=True)
class McpConfig:
    servers: tuple[McpServer, ...] = ()

    def for_chat(self, chat_id: int, use: Use) -> tuple[McpServer, ...]:
        return tuple(s for s in self.servers if use in s.use and s.serves_chat(chat_id))

    def named(self, name: str) -> McpServer | None:
        return next((s for s in self.servers if s.name == name), None)


def environ_with_env_file(env_file: str | Path | None) -> dict[str, str]:
    """What `${VAR}` reads: the variables the settings are read from, as pydantic-settings reads them: the env file's
    values (`.env` unless told otherwise) overlaid by the process's environment. Blocking: call it in a thread."""
    from dotenv import dotenv_values

    values: dict[str, str] = {}
    if env_file is not None and Path(env_file).is_file():
        values = {key: value for key, value in dotenv_values(env_file, encoding="utf-8").items() if value is not None}
    return values | dict(os.environ)


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> McpConfig:
    """The file's servers, or McpConfigError. Blocking: call it in a thread."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise McpConfigError(f"MCP_SERVERS: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise McpConfigError(f"MCP_SERVERS: {path} is over {MAX_CONFIG_BYTES} bytes")
    if not data.strip():  # emptied (`: > mcp.json`), as an operator removing every server at once does
        return McpConfig()
    return parse_config(data, os.environ if environ is None else environ, str(path))


def parse_config(data: bytes | str, environ: Mapping[str, str], source: str = "MCP_SERVERS") -> McpConfig:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise McpConfigError(f"{source}: not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers", {}), dict):
        raise McpConfigError(f'{source}: expected {{"mcpServers": {{"NAME": {{…}}}}}}')
    entries: dict[str, Any] = document.get("mcpServers", {})
    if len(entries) > MAX_SERVERS:
        raise McpConfigError(f"{source}: {len(entries)} servers, more than {MAX_SERVERS}")
    servers = []
    for name, entry in entries.items():
        server = _server(str(name), entry, environ)
        if server is not None:
            servers.append(server)
    return McpConfig(tuple(servers))


def _server(name: str, entry: object, environ: Mapping[str, str]) -> McpServer | None:
    shown = name[:MAX_SERVER_NAME_CHARS]
    if not SERVER_NAME.fullmatch(name):
        raise McpConfigError(f"server {shown!r}: a name is 1 to 32 letters, digits, `_` or `-`")
    if "__" in name:
        raise McpConfigError(f"server {shown!r}: `__` separates a server's name from its tools' names")
    if not isinstance(entry, dict):
        raise McpConfigError(f"server {name!r}: expected an object")
    unknown = set(entry) - _IGNORED_KEYS - _STDIO_KEYS - _HTTP_KEYS - _CREWBOT_KEYS
    if unknown:
        raise McpConfigError(f"server {name!r}: unknown key {sorted(unknown)[0][:40]!r}")
    if entry.get("disabled") is True:
        return None
    kind = entry.get("type", entry.get("transport"))
    if kind in ("sse",):
        raise McpConfigError(f"server {name!r}: the SSE transport is not supported; use streamable HTTP (`url`)")
    if ("command" in entry) == ("url" in entry):
        raise McpConfigError(f"server {name!r}: give either `command` (stdio) or `url` (streamable HTTP)")
    common = _crewbot_keys(name, entry)
    if "command" in entry:
        if set(entry) & _HTTP_KEYS:
            raise McpConfigError(f"server {name!r}: `headers` belongs to an HTTP server (`url`)")
        command = _string(name, "command", entry["command"])
        args = tuple(_string(name, "args", a) for a in _list(name, "args", entry.get("args", [])))
        for key, value in (("command", command), *(("args", a) for a in args)):
            _refuse_reference(name, key, value)
        _refuse_secret_options(name, args)
        cwd = _string(name, "cwd", entry["cwd"]) if "cwd" in entry else None
        env = _secrets(name, "env", entry.get("env", {}), environ)
        return McpServer(name, Transport.STDIO, command=command, args=args, env=env, cwd=cwd, **common)
    if set(entry) & _STDIO_KEYS:
        raise McpConfigError(f"server {name!r}: `args` and `env` belong to a stdio server (`command`)")
    url = _string(name, "url", entry["url"])
    _refuse_reference(name, "url", url)
    _check_url(name, url)
    headers = _secrets(name, "headers", entry.get("headers", {}), environ)
    return McpServer(name, Transport.HTTP, url=url, headers=headers, **common)


def _crewbot_keys(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    if "tools" in entry:
        tools = [_string(name, "tools", t) for t in _list(name, "tools", entry["tools"])]
        if len(tools) > MAX_ALLOWED_TOOLS:
            raise McpConfigError(f"server {name!r}: `tools` lists more than {MAX_ALLOWED_TOOLS}")
        keys["tools"] = frozenset(tools)
    if "use" in entry:
        raw = entry["use"]
        values = [raw] if isinstance(raw, str) else _list(name, "use", raw)
        try:
            keys["use"] = frozenset(Use(v) for v in values)
        except ValueError:
            raise McpConfigError(f'server {name!r}: `use` takes "main" and "subagents"') from None
    if "chats" in entry:
        chats = _list(name, "chats", entry["chats"])
        if len(chats) > MAX_CHATS or not all(isinstance(c, int) and not isinstance(c, bool) for c in chats):
            raise McpConfigError(f"server {name!r}: `chats` is a list of chat ids (numbers)")
        keys["chats"] = frozenset(chats)
    if "timeout_seconds" in entry:
        timeout = entry["timeout_seconds"]
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise McpConfigError(f"server {name!r}: `timeout_seconds` is a number")
        if not MIN_TIMEOUT_SECONDS <= timeout <= MAX_TIMEOUT_SECONDS:
            raise McpConfigError(
                f"server {name!r}: `timeout_seconds` is from {MIN_TIMEOUT_SECONDS:g} to {MAX_TIMEOUT_SECONDS:g}"
            )
        keys["timeout_seconds"] = float(timeout)
    return keys


def _string(name: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise McpConfigError(f"server {name!r}: `{key}` must hold non-empty strings")
    return value


def _list(name: str, key: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise McpConfigError(f"server {name!r}: `{key}` must be a list")
    return value


def _refuse_reference(name: str, key: str, value: str) -> None:
    if _ANY_REFERENCE.search(value):
        raise McpConfigError(
            f"server {name!r}: a secret in `{key}` is refused (it shows in process lists and logs); "
            "put it in `env` (stdio) or `headers` (HTTP) as ${VAR}"
        )


def _refuse_secret_options(name: str, args: tuple[str, ...]) -> None:
    """`--token=abc` or `--api-key abc`, a URL with a password, a header or a variable that carries a secret: the
    value is a secret in the process list. Heuristics (docs/mcp.md): they catch the usual forms, not every one."""
    for arg in args:
        header = _HEADER_ARG.match(arg)
        assignment = _ASSIGNMENT_ARG.match(arg)
        value = arg.split(":", 1)[1].strip() if header else ""
        if header and (_SECRET_WORD.search(header.group(1)) or _CREDENTIAL_SCHEME.match(value)):
            what = f"a `{header.group(1)[:40]}:` header"
        elif assignment and _SECRET_WORD.search(assignment.group(1)):
            what = f"`{assignment.group(1)[:40]}=`"
        elif "://" in arg and _has_password(arg):
            what = "a URL with a password"
        else:
            continue
        raise McpConfigError(
            f"server {name!r}: `args` passes a secret ({what}); command lines show in process lists: give it to "
            "the server in `env` as ${VAR}"
        )
    for index, arg in enumerate(args):
        match = _OPTION.match(arg)
        if match is None or not _SECRET_WORD.search(match.group(1)) or _NAMES_A_PLACE.search(match.group(1)):
            continue
        given = match.group(2) is not None or (index + 1 < len(args) and not args[index + 1].startswith("-"))
        if given:
            raise McpConfigError(
                f"server {name!r}: `args` passes a secret ({arg.split('=')[0][:40]}); command lines show in "
                "process lists: give it to the server in `env` as ${VAR}"
            )


def _has_password(arg: str) -> bool:
    try:
        return urlsplit(arg.strip()).password is not None
    except ValueError:
        return False


def _check_url(name: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise McpConfigError(f"server {name!r}: `url` must be an http:// or https:// URL")
    if parts.username or parts.password:
        raise McpConfigError(f"server {name!r}: a user or password in `url` is refused; send it in `headers`")
    for key, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_WORD.search(key):
            raise McpConfigError(
                f"server {name!r}: `url` carries a secret in its query ({key[:40]}); send it in `headers` as ${{VAR}}"
            )


def _secrets(name: str, key: str, value: object, environ: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, dict):
        raise McpConfigError(f"server {name!r}: `{key}` must be an object of strings")
    resolved: dict[str, str] = {}
    for field, raw in value.items():
        if not isinstance(raw, str) or "\0" in raw or "\n" in raw:
            raise McpConfigError(f"server {name!r}: `{key}.{str(field)[:40]}` must be a one-line string")

        def expand(match: re.Match[str], field: str = str(field)) -> str:
            variable = match.group(1)
            if variable not in environ:
                raise McpConfigError(
                    f"server {name!r}: `{key}.{field[:40]}` names ${{{variable}}}, which the bot's environment "
                    "does not set"
                )
            return environ[variable]

        resolved[str(field)] = _REFERENCE.sub(expand, raw)
    return resolved
