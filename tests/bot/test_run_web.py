"""How a run's connections through the egress door read to operators, and that what a container asked for
(host names, the reasons that quote them) shows as one safe, bounded line in the chat and on a terminal."""

from __future__ import annotations

from bot.channels.formatting import markdown_to_telegram_html
from bot.run_web import MAX_SHOWN_HOST_CHARS, MAX_SHOWN_REASON_CHARS, connection_text, totals_text, web_lines
from core.store.egress import EgressTotals
from tests.egress_helpers import allowed, refused

MB = 1024 * 1024


def test_totals_read_as_connections_refused_and_bytes_each_way() -> None:
    busy = EgressTotals(connections=12, refused=2, bytes_up=3 * 1024, bytes_down=int(1.2 * MB))
    assert totals_text(busy) == "12 connections (2 refused), 1.2 MB down, 3 KB up"
    assert totals_text(EgressTotals(1, 0, 0, 500)) == "1 connection, 500 bytes down, 0 bytes up"
    flood = EgressTotals(connections=1_200, refused=1_200)
    assert totals_text(flood) == "1,200 connections (1,200 refused), 0 bytes down, 0 bytes up"


def test_a_connection_reads_as_asked_to_where_with_its_bytes_or_as_refused_and_why() -> None:
    pypi = allowed("r", -1, "pypi.org", 443, "151.101.0.223", down=int(1.1 * MB))
    assert connection_text(pypi) == "pypi.org:443 → 151.101.0.223, 1.1 MB down"
    sent = allowed("r", -1, "api.github.com", 443, "140.82.112.6", down=2048, up=5 * 1024)
    assert connection_text(sent) == "api.github.com:443 → 140.82.112.6, 2 KB down, 5 KB up"
    cut = allowed("r", -1, "files.example", 443, "2001:db8::1", down=10 * MB, reason="over SUBAGENT_EGRESS_MAX_BYTES")
    assert connection_text(cut) == (
        "files.example:443 → [2001:db8::1], 10.0 MB down, cut: over SUBAGENT_EGRESS_MAX_BYTES"
    )
    evil = refused("r", -1, "evil.example", 443, "evil.example:443 is not in SUBAGENT_EGRESS_ALLOW")
    assert connection_text(evil) == "evil.example:443 refused: evil.example:443 is not in SUBAGENT_EGRESS_ALLOW"
    assert connection_text(refused("r", -1, "[::1]", 22, "")) == "[::1]:22 refused"


def test_what_a_container_asked_for_shows_on_one_safe_bounded_line() -> None:
    host = "~~~\n```evil\x1b[2J\u202e.example" + "a" * 300
    reason = f"{host}:443 is not allowed\r\nclick [here](https://evil.example/login) `now`\u2028" + "x" * 500
    line = connection_text(refused("r", -1, host, 443, reason))

    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u202e" not in line
    assert "\u2028" not in line and "`" not in line and "](" not in line
    assert line.startswith("???????evil??2J?.example")  # a host name has none of these characters
    assert len(line) <= MAX_SHOWN_HOST_CHARS + len(":443 refused: ") + MAX_SHOWN_REASON_CHARS
    assert line.endswith("…")
    html = markdown_to_telegram_html("\n".join(["Web: 1 connection (1 refused), 0 bytes down, 0 bytes up", line]))
    assert "<pre>" not in html and "<code>" not in html and "<a " not in html  # no fence, code span or link


def test_the_web_block_is_the_totals_then_the_latest_connections_and_nothing_without_any() -> None:
    latest = [allowed("r", -1, f"h{n}.example", 443, "192.0.2.1", down=100) for n in range(3)]

    lines = web_lines(EgressTotals(7, 0, 0, 700), latest)

    assert lines[0] == "Web: 7 connections, 700 bytes down, 0 bytes up; the last 3:"
    assert lines[1:] == [f"h{n}.example:443 → 192.0.2.1, 100 bytes down" for n in range(3)]
    assert web_lines(EgressTotals(3, 0, 0, 300), latest)[0] == "Web: 3 connections, 300 bytes down, 0 bytes up"
    assert web_lines(EgressTotals(), []) == []
