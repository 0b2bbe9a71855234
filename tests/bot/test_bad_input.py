"""Odd input through real PTB and the fake Bot API: unusual Unicode, the longest message, odd command
arguments, whitespace. Nothing crashes, every message is stored, commands are answered (or ignored when
meant for another bot), and the bot still answers afterwards. No Docker: the engine socket is dead."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crewbot.app import App
from tests.fakes.telegram_server import FakeTelegram, SentMessage
from tests.harness import make_settings, telegram_app

ADMIN_ID = 4242
REPLY_WAIT_SECONDS = 15.0
MAX_TELEGRAM_TEXT = 4096

UNICODE_SAMPLES = [
    "RTL override \u202eexe.txt\u202c and marks \u200fשלום\u200e مرحبا",
    "ZWJ family 👨\u200d👩\u200d👧\u200d👦 rainbow flag 🏳\ufe0f\u200d🌈 zero\u200bwidth",
    "combining Z\u0351\u0300\u0310a\u0352\u0308l\u033ag\u0489o e\u0301\u0308 \u0915\u094d\u0937",
    "astral 𝕳𝖊𝖑𝖑𝖔 𓀀 🧪 \U0010fffd",
    "markup <b>not bold</b> & <a href='x'>a</a> **stars** `tick ```fence",
]


@dataclass
class Chats:
    group: int
    private: int


def unique_ids() -> Chats:
    """Ids no other test uses: a group (negative, above the supergroup range) and a private chat."""
    return Chats(
        group=-(2_000_000_000 + secrets.randbelow(900_000_000)), private=3_000_000_000 + secrets.randbelow(10**8)
    )


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FakeTelegram, App, Chats]]:
    # Subagents are on so /cancel parses its arguments, but the engine socket leads nowhere: no Docker here.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    chats = unique_ids()
    async with FakeTelegram() as tg:
        tg.add_chat(chats.group, title="odd input")
        settings = make_settings(
            tmp_path,
            tg,
            ALLOWED_CHAT_IDS=f"{chats.group},{chats.private}",
            ADMIN_USER_IDS=str(ADMIN_ID),
            LOG_LEVEL="INFO",
        )
        async with telegram_app(settings, with_subagents=True) as app:
            yield tg, app, chats


def flat(text: str) -> str:
    """What the offline model quotes of a message (whitespace collapsed)."""
    return " ".join(text.split())


async def next_reply(tg: FakeTelegram, chat_id: int, after: int) -> SentMessage:
    sent = await tg.wait_for_messages(chat_id, after + 1, timeout_seconds=REPLY_WAIT_SECONDS)
    return sent[after]


async def stored_contents(app: App, chat_id: int) -> list[str]:
    async with app.stores.db.conn.execute(
        "SELECT content FROM messages WHERE chat_id = ? AND is_bot = 0 ORDER BY id", (chat_id,)
    ) as cursor:
        return [str(row[0]) for row in await cursor.fetchall()]


async def test_unicode_long_and_blank_messages_are_stored_and_answered(
    env: tuple[FakeTelegram, App, Chats],
) -> None:
    tg, app, chats = env
    mention = f"@{tg.bot_username}"
    pushed: list[str] = []
    # One at a time, so each gets its own turn and its own quoted reply: the text survives the round trip
    # (store, prompt, Markdown to HTML, Telegram) unchanged.
    for index, sample in enumerate(UNICODE_SAMPLES):
        text = f"{mention} #u{index} {sample}"
        tg.push_message(chats.group, text)
        pushed.append(text)
        reply = await next_reply(tg, chats.group, index)
        assert f"#u{index}" in reply.plain_text
        if "<b>" not in sample:  # the markup sample is rendered, not quoted verbatim
            assert flat(text) in reply.plain_text, reply.plain_text
        else:
            assert "<b>not bold</b> &" in reply.plain_text  # escaped, not interpreted as HTML
    replies = len(UNICODE_SAMPLES)

    longest = f"{mention} #long "
    longest += "x" * (MAX_TELEGRAM_TEXT - len(longest))
    assert len(longest) == MAX_TELEGRAM_TEXT
    tg.push_message(chats.group, longest)
    pushed.append(longest)
    reply = await next_reply(tg, chats.group, replies)
    assert "#long" in reply.plain_text and "…" in reply.plain_text  # quoted, shortened
    replies += 1

    blank = " \n\n\t  \n "
    tg.push_message(chats.group, blank)  # no mention: stored, no turn
    blank_mention = f"{mention}\n\n   \n"
    tg.push_message(chats.group, blank_mention)
    pushed += [blank, blank_mention]
    reply = await next_reply(tg, chats.group, replies)
    assert reply.plain_text.startswith("Crew: Offline demo model here")
    replies += 1

    tg.push_message(chats.private, "\n \n")  # in a private chat every message triggers
    (private_reply,) = await tg.wait_for_messages(chats.private, 1, timeout_seconds=REPLY_WAIT_SECONDS)
    assert private_reply.plain_text.startswith("Crew: Offline demo model here")

    tg.push_message(chats.group, f"{mention} still there? #end")
    pushed.append(f"{mention} still there? #end")
    reply = await next_reply(tg, chats.group, replies)
    assert "still there? #end" in reply.plain_text

    assert await stored_contents(app, chats.group) == pushed
    assert await stored_contents(app, chats.private) == ["\n \n"]
    await app.wait_quiet(chats.group)
    async with app.stores.db.conn.execute("SELECT status, COUNT(*) FROM turns GROUP BY status") as cursor:
        assert {str(r[0]): int(r[1]) for r in await cursor.fetchall()} == {"completed": replies + 2}
    assert await app.stores.outbox.counts() == {"sent": replies + 2}


async def test_commands_with_odd_arguments_are_answered_or_ignored(env: tuple[FakeTelegram, App, Chats]) -> None:
    tg, app, chats = env
    huge = "Z" * 5000
    commands: list[tuple[str, str | None]] = [
        ("/cancel", "Crew: Usage: /cancel <run id>, /cancel all, or /cancel all chat"),
        ("/cancel a b c", "Crew: Usage: /cancel <run id>, /cancel all, or /cancel all chat"),
        (f"/cancel {huge}", f"Crew: No run {'Z' * 64} in this chat. /subagents lists them."),
        ("/cancel ../../etc/passwd", "Crew: No run ../../etc/passwd in this chat. /subagents lists them."),
        # Tags stay text; "&amp;" reads as "&": replies are CommonMark, where it is a character reference.
        ("/cancel <b>x</b>&amp;", "Crew: No run <b>x</b>& in this chat. /subagents lists them."),
        ("/cancel \u202eabc\u200d", "Crew: No run \u202eabc\u200d in this chat. /subagents lists them."),
        ("/subagents@other_bot", None),  # another bot's command: stored, not answered
        ("/cancel@other_bot all", None),
        (f"/subagents@{tg.bot_username}", "Crew: No subagent runs in this chat yet."),
        (f"/cancel@{tg.bot_username.upper()} all", "Crew: Cancelled 0 subagent run(s)."),
        ("/cancel\n\nall", "Crew: Cancelled 0 subagent run(s)."),
    ]
    for text, _ in commands:
        tg.push_message(chats.group, text, user_id=ADMIN_ID, first_name="Op")
    expected = [answer for _, answer in commands if answer is not None]
    tg.push_message(chats.group, f"@{tg.bot_username} and now? #after")  # the bot still answers
    sent = await tg.wait_for_messages(chats.group, len(expected) + 1, timeout_seconds=REPLY_WAIT_SECONDS)
    assert [m.plain_text for m in sent[: len(expected)]] == expected
    assert "and now? #after" in sent[-1].plain_text
    await app.wait_quiet(chats.group)
    assert len(tg.sent_messages(chats.group)) == len(expected) + 1
    assert await stored_contents(app, chats.group) == [text for text, _ in commands] + [
        f"@{tg.bot_username} and now? #after"
    ]


async def test_lone_surrogate_in_update_json_is_stored_and_answered(env: tuple[FakeTelegram, App, Chats]) -> None:
    tg, app, chats = env
    # The fake serialises with json.dumps, so the text reaches PTB as the escape "\ud800".
    tg.push_message(chats.group, f"@{tg.bot_username} lone \ud800 surrogate #s")
    tg.push_message(chats.group, f"@{tg.bot_username} after it #t")
    await tg.wait_until(
        lambda: any("#t" in m.plain_text for m in tg.sent_messages(chats.group)) or None,
        timeout_seconds=REPLY_WAIT_SECONDS,
    )
    await app.wait_quiet(chats.group)
    contents = await stored_contents(app, chats.group)
    assert len(contents) == 2, contents  # both stored (the odd one with a replacement character)
    assert "\ufffd" in contents[0]
