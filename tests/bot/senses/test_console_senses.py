"""The console as on Telegram: `/file photo.png what is this?` shows the image to the model and `/file note.ogg`
is transcribed (a fake STT service in a thread); the offline demo model says what it was shown and heard."""

from __future__ import annotations

from pathlib import Path

from tests.bot.senses.media import ogg_opus, png
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.fakes.stt_server import FakeStt


def test_a_console_photo_and_voice_note_are_seen_and_heard(tmp_path: Path) -> None:
    (tmp_path / "photo.png").write_bytes(png(2000, 1000))
    (tmp_path / "note.ogg").write_bytes(ogg_opus(4.0))
    with FakeStt() as stt:
        stt.answer("Crew, remind me to water the plants", seconds=4.0)
        env = crewbot_env(tmp_path / "data") | {"STT_BASE_URL": stt.base_url, "MERGE_WINDOW_SECONDS": "0"}
        done = run_crewbot(["console"], env, tmp_path, stdin="/file photo.png what is this?\n/file note.ogg\n")
    out = done.stdout
    assert "(attached photo.png, " in out, out + done.stderr
    assert "wrote: “[file f1: photo.png, image/png, 8 KB] (shown to you as image 1, 1568×784) what is this?”" in out
    assert "I was shown 1 image(s): image 1 (1568×784)" in out
    assert '“[audio 0:04, f2: note.ogg] "Crew, remind me to water the plants"”' in out
    assert 'I heard: "Crew, remind me to water the plants".' in out
    assert len(stt.calls) == 1 and stt.calls[0].data == ogg_opus(4.0)
