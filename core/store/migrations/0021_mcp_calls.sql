-- MCP tool calls (core/mcp_servers.py), one row each, the main agent's and subagents' alike: what `crewbot stats`
-- shows of them (crewbot/mcp_stats.py). Never the arguments or the result: only who, which tool, and how it went.
CREATE TABLE mcp_calls (
    id            INTEGER PRIMARY KEY,
    chat_id       INTEGER NOT NULL,              -- the conversation (no reference: stats outlive a chat)
    run_id        TEXT,                          -- the subagent run it was made for; NULL: the main agent's
    at            REAL    NOT NULL,              -- unix seconds, when the call ended
    server        TEXT    NOT NULL,              -- the operator's name for the server
    tool          TEXT    NOT NULL,              -- the server's name for the tool
    outcome       TEXT    NOT NULL,              -- ok, tool_error, timeout, failed, refused
    seconds       REAL    NOT NULL,
    result_chars  INTEGER NOT NULL               -- of the server's answer, before any cut
);
CREATE INDEX mcp_calls_by_time ON mcp_calls (at, chat_id);
CREATE INDEX mcp_calls_by_run ON mcp_calls (run_id) WHERE run_id IS NOT NULL;
