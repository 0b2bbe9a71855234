"""The MCP_SERVERS file: the mcpServers format as other tools write it, crewbot's keys, and secrets only where
they cannot leak (refused elsewhere with one line naming the server and the key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.mcp_config import McpConfigError, Transport, Use, environ_with_env_file, load_config, parse_config


def parse(servers: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return parse_config(json.dumps({"mcpServers": servers}), environ or {})


def refusal(servers: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(McpConfigError) as caught:
        parse(servers, environ)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_claude_desktop_file_works_unchanged() -> None:
    # As Claude Desktop's and Cursor's docs show one, literal token in env included.
    document = {
        "mcpServers": {
            "github": {
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-github"],
                "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_literal_token_value"},
            },
            "tracker": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Team": "a"}},
            "off": {"command": "x", "disabled": True, "autoApprove": ["y"]},
        }
    }
    config = parse_config(json.dumps(document), {})
    assert [s.name for s in config.servers] == ["github", "tracker"]
    github, tracker = config.servers
    assert github.transport is Transport.STDIO and github.args == ("-y", "@modelcontextprotocol/server-github")
    assert github.env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_literal_token_value"}
    assert github.use == {Use.MAIN} and github.chats is None and github.tools is None
    assert tracker.transport is Transport.HTTP and tracker.headers == {"X-Team": "a"}


def test_references_are_read_from_the_bot_environment() -> None:
    config = parse(
        {
            "s": {"command": "srv", "env": {"TOKEN": "${MY_TOKEN}", "MIXED": "a-${MY_TOKEN}-b"}},
            "h": {"url": "https://h.example/mcp", "headers": {"Authorization": "Bearer ${API}"}},
        },
        {"MY_TOKEN": "t0ken", "API": "k3y"},
    )
    assert config.servers[0].env == {"TOKEN": "t0ken", "MIXED": "a-t0ken-b"}
    assert config.servers[1].headers == {"Authorization": "Bearer k3y"}


def test_crewbot_keys() -> None:
    config = parse(
        {
            "s": {
                "command": "srv",
                "tools": ["a", "b"],
                "use": ["main", "subagents"],
                "chats": [-100123, 42],
                "timeout_seconds": 5,
            },
            "t": {"command": "srv", "use": "subagents"},
        }
    )
    s, t = config.servers
    assert s.tools == {"a", "b"} and s.use == {Use.MAIN, Use.SUBAGENTS} and s.chats == {-100123, 42}
    assert s.timeout_seconds == 5.0 and s.allows_tool("a") and not s.allows_tool("c")
    assert t.use == {Use.SUBAGENTS}
    assert config.for_chat(42, Use.MAIN) == (s,)
    assert config.for_chat(7, Use.MAIN) == ()
    assert config.for_chat(7, Use.SUBAGENTS) == (t,)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"command": "srv", "args": ["--token", "${TOKEN}"]}, "`args`"),
        ({"command": "srv", "args": ["--token=abcdef"]}, "passes a secret (--token)"),
        ({"command": "srv", "args": ["--api-key", "abcdef"]}, "passes a secret (--api-key)"),
        ({"command": "${SRV}"}, "`command`"),
        ({"url": "https://h.example/mcp?api_key=${KEY}"}, "`url`"),
        ({"url": "https://h.example/mcp?access_token=abc"}, "query (access_token)"),
        ({"url": "https://user:pw@h.example/mcp"}, "user or password"),
    ],
)
def test_a_secret_in_the_wrong_place_is_refused_in_one_line(entry: dict[str, Any], words: str) -> None:
    message = refusal({"srv": entry}, {"TOKEN": "x", "SRV": "y", "KEY": "z"})
    assert "server 'srv'" in message and words in message
    assert "abcdef" not in message and "pw" not in message.split("password")[-1]


def test_harmless_args_and_flags_without_a_value_pass() -> None:
    args = ["--verbose", "--port", "8080", "--auth-mode=none", "--token-file", "/etc/t", "--use-token", "--x"]
    config = parse({"s": {"command": "srv", "args": args}, "h": {"url": "https://h.example/mcp?team=a&page=2"}})
    assert config.servers[0].args[-1] == "--x"
    assert config.servers[1].url.endswith("page=2")


@pytest.mark.parametrize(
    ("servers", "words"),
    [
        ({"s": {"command": "srv", "env": {"T": "${NOT_SET}"}}}, "${NOT_SET}"),
        ({"s": {"command": "srv", "url": "https://x"}}, "either `command`"),
        ({"s": {}}, "either `command`"),
        ({"s": {"url": "ftp://x/y"}}, "http://"),
        ({"s": {"type": "sse", "url": "https://x/sse"}}, "SSE"),
        ({"a__b": {"command": "srv"}}, "`__`"),
        ({"bad name": {"command": "srv"}}, "letters"),
        ({"s": {"command": "srv", "use": ["everything"]}}, "`use`"),
        ({"s": {"command": "srv", "chats": ["x"]}}, "`chats`"),
        ({"s": {"command": "srv", "timeout_seconds": 0}}, "`timeout_seconds`"),
        ({"s": {"command": "srv", "tokens": 1}}, "unknown key"),
        ({"s": {"command": "srv", "headers": {"a": "b"}}}, "`headers`"),
        ({"s": {"url": "https://x/mcp", "env": {"a": "b"}}}, "`env`"),
        ({"s": {"command": "srv", "env": {"A": "line\nbreak"}}}, "one-line"),
    ],
)
def test_invalid_entries_are_refused_in_one_line(servers: dict[str, Any], words: str) -> None:
    assert words in refusal(servers)


def test_a_file_that_is_not_json_or_too_big(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text("{not json")
    with pytest.raises(McpConfigError, match="not valid JSON"):
        load_config(path, {})
    path.write_text(" " * (1024 * 1024 + 1))
    with pytest.raises(McpConfigError, match="over"):
        load_config(path, {})
    with pytest.raises(McpConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json", {})


def test_where_never_shows_env_or_headers() -> None:
    config = parse({"s": {"command": "srv", "args": ["-v"], "env": {"TOKEN": "${T}"}}}, {"T": "supersecret"})
    assert config.servers[0].where == "srv -v"
    assert "supersecret" in config.servers[0].secret_values


def test_a_blank_setting_means_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from core.settings import load_settings

    monkeypatch.setenv("MCP_SERVERS", "")
    assert load_settings().mcp_servers is None
    monkeypatch.setenv("MCP_SERVERS", "/etc/crewbot/mcp.json")
    assert load_settings().mcp_servers == Path("/etc/crewbot/mcp.json")


def test_var_references_read_the_env_file_overlaid_by_the_environment(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    env_file = tmp_path / ".env"
    env_file.write_text("ONLY_IN_DOTENV=from-dotenv-123\nBOTH=from-dotenv\n")
    monkeypatch.setenv("BOTH", "from-environment")
    environ = environ_with_env_file(env_file)
    entry = {"command": "srv", "env": {"A": "${ONLY_IN_DOTENV}", "B": "${BOTH}"}}
    server = parse_config(json.dumps({"mcpServers": {"s": entry}}), environ).servers[0]
    assert server.env == {"A": "from-dotenv-123", "B": "from-environment"}
    assert environ_with_env_file(tmp_path / "missing.env").get("ONLY_IN_DOTENV") is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-y", "@modelcontextprotocol/server-postgres", "postgresql://app:S3cretPw@db/prod"], "a URL with a password"),
        (["mcp-remote", "https://x.example/mcp", "--header", "Authorization: Bearer sk-live-abc"], "`Authorization:`"),
        (["mcp-remote", "https://x.example/mcp", "--header", "X-Custom: Bearer sk-live-abc"], "`X-Custom:`"),
        (["GITHUB_TOKEN=ghp_abcdef1234567890", "srv"], "`GITHUB_TOKEN=`"),
    ],
)
def test_secrets_in_args_in_the_usual_forms_are_refused(args: list[str], said: str) -> None:
    with pytest.raises(McpConfigError, match="passes a secret") as caught:
        parse_config(json.dumps({"mcpServers": {"s": {"command": "npx", "args": args}}}), {})
    assert said in str(caught.value) and "S3cretPw" not in str(caught.value) and "sk-live" not in str(caught.value)


def test_args_that_only_look_alike_pass() -> None:
    args = ["https://x.example/mcp", "postgresql://app@db/prod", "--header", "Accept: text/plain", "LOG_LEVEL=debug"]
    assert parse_config(json.dumps({"mcpServers": {"s": {"command": "srv", "args": args}}}), {}).servers
