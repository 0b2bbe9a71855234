"""`crewbot doctor`'s MCP lines against real servers (tests/fakes/mcp_server.py): each started and its tools
listed, a bad file refused in one line, a failing server's line with its fix, and no secret printed."""

from __future__ import annotations

import json
from pathlib import Path

from crewbot.doctor import run_doctor
from crewbot.doctor_mcp import check_mcp
from tests.fakes.memory_runtime import MemoryRuntime
from tests.harness import make_settings
from tests.mcp_helpers import http_server, stdio_entry, write_config


async def test_each_server_is_started_and_its_tools_listed(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DOCTOR_TOKEN", "doctor-secret-999")
    async with http_server() as url:
        path = write_config(
            tmp_path / "mcp.json",
            {
                "notes": stdio_entry(tools=["echo", "add"], env={"T": "${DOCTOR_TOKEN}"}),
                "web": {"url": url, "headers": {"Authorization": "Bearer ${DOCTOR_TOKEN}"}, "use": ["subagents"]},
                "missing": {"command": "/nonexistent/mcp-server"},
                "none": stdio_entry(tools=["no_such_tool"]),
            },
        )
        settings = make_settings(tmp_path, MCP_SERVERS=str(path))
        lines: list[str] = []
        code = await run_doctor(settings, lines.append, runtime=MemoryRuntime(images={settings.subagent_image}))
    mcp = {line.split()[2]: line for line in lines if line.split()[1] == "mcp"}
    assert mcp["notes"].startswith("ok") and "2 tools for main (echo, add)" in mcp["notes"]
    assert mcp["web"].startswith("ok") and "for subagents" in mcp["web"] and "header_has" in mcp["web"]
    assert mcp["missing"].startswith("FAIL") and "fix: install the server" in mcp["missing"]
    assert mcp["none"].startswith("FAIL") and "`tools` list names none" in mcp["none"]
    assert code == 1
    assert not any("doctor-secret-999" in line for line in lines)


async def test_a_bad_file_is_one_line_with_its_fix(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"gh": {"command": "srv", "args": ["--token=ghp_abcdef"]}}}))
    (result,) = await check_mcp(make_settings(tmp_path, MCP_SERVERS=str(path)))
    assert result[0] == "mcp" and result[1].status == "FAIL"
    assert "passes a secret (--token)" in result[1].detail and "ghp_abcdef" not in result[1].detail
    assert result[1].fix is not None


async def test_no_file_is_a_skip(tmp_path: Path) -> None:
    (result,) = await check_mcp(make_settings(tmp_path))
    assert result[1].status == "skip"


async def test_a_reference_set_only_in_dotenv_resolves(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # Settings read `.env` from the working directory: so does `${VAR}`
    (tmp_path / ".env").write_text("DOTENV_ONLY_TOKEN=dotenv-secret-321\n")
    path = write_config(
        tmp_path / "mcp.json", {"notes": stdio_entry(tools=["echo"], env={"T": "${DOTENV_ONLY_TOKEN}"})}
    )
    checks = await check_mcp(make_settings(tmp_path, MCP_SERVERS=str(path)))
    assert checks[0][1].status == "ok", checks
