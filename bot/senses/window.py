"""What the senses add to a prompt's window: the transcripts of its voice notes, audio files and video notes,
quoted as the members' words, and the newest VISION_MAX_IMAGES images, prepared for the model and marked in
the lines that posted them."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bot.senses.image_prep import PreparedImage
from bot.senses.seen_images import Seen, SeenImages
from bot.senses.vision import is_image_file
from core.store.chat_files import ChatFile, FileKind
from core.store.messages import StoredMessage
from core.store.transcripts import Transcript, TranscriptState, TranscriptStore

AUDIO_KINDS = frozenset({FileKind.VOICE, FileKind.AUDIO, FileKind.VIDEO_NOTE})
NOT_SET_UP = "speech to text is not set up (STT_BASE_URL)"
MAX_QUOTED_CHARS = 4_000  # of one transcript in a prompt line (the store keeps more)


def is_audio_file(file: ChatFile) -> bool:
    """A voice note, an audio file or a video note: transcribed when speech to text is set up."""
    if file.kind in AUDIO_KINDS:
        return True
    return file.kind is FileKind.DOCUMENT and (file.mime_type or "").lower().startswith("audio/")


def clock(seconds: float | None) -> str:
    """0:12, 3:05, 1:02:03: a length as a player shows it."""
    if seconds is None or not math.isfinite(seconds):
        return "?:??"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"


def quoted(text: str) -> str:
    """A member's words as one quoted string: its quotes and line breaks escaped, so nothing it says can end the
    quote or start a line of its own in the prompt."""
    flat = text[:MAX_QUOTED_CHARS] + ("…" if len(text) > MAX_QUOTED_CHARS else "")
    return json.dumps(flat, ensure_ascii=False)


def audio_line(file: ChatFile, transcript: Transcript | None, stt_on: bool, safe_name: str) -> str:
    """`[voice 0:12, f4] "…"`, or why there are no words: how the prompt shows a transcribed file."""
    label = {FileKind.VOICE: "voice", FileKind.VIDEO_NOTE: "video note"}.get(file.kind, "audio")
    said = [s for s in (file.duration_seconds, transcript.audio_seconds if transcript else None) if s is not None]
    seconds = max(said) if said else None  # the client's word, or the file's own when it says more
    named = f": {safe_name}" if file.kind in (FileKind.AUDIO, FileKind.DOCUMENT) else ""
    head = f"[{label} {clock(seconds)}, {file.ref}{named}]"
    if transcript is None:
        return f"{head} (not transcribed: {NOT_SET_UP})" if not stt_on else f"{head} (not transcribed yet)"
    if transcript.state is TranscriptState.PENDING:
        return f"{head} (being transcribed)"
    if transcript.state is TranscriptState.FAILED:
        return f"{head} (not transcribed: {transcript.reason or 'unknown reason'})"
    return f"{head} {quoted(transcript.text)}" if transcript.text.strip() else f"{head} (no words heard)"


@dataclass(slots=True)
class SenseNotes:
    """Per chat file in the window: `audio` the line that replaces its file line, `image` what follows it."""

    audio: dict[int, str] = field(default_factory=dict)
    image: dict[int, str] = field(default_factory=dict)
    shown: list[tuple[ChatFile, PreparedImage]] = field(default_factory=list)  # in the order they are sent


class WindowSenses:
    def __init__(
        self,
        transcripts: TranscriptStore,
        images: SeenImages | None,
        *,
        max_images: Callable[[], int],
        stt_on: bool,
        safe_name: Callable[[str], str],
    ) -> None:
        self._transcripts = transcripts
        self._images = images  # None: no channel to download from
        self._max_images = max_images  # VISION_MAX_IMAGES, read at each turn
        self._stt_on = stt_on
        self._safe_name = safe_name

    async def look(self, window: Sequence[StoredMessage], with_images: bool) -> SenseNotes:
        notes = SenseNotes()
        files = [m.file for m in window if m.file is not None]
        audio = [f for f in files if is_audio_file(f)]
        if audio:
            found = await self._transcripts.of_files(f.id for f in audio)
            for file in audio:
                if self._stt_on or file.id in found:  # with no speech to text, the file's own line as before
                    notes.audio[file.id] = audio_line(
                        file, found.get(file.id), self._stt_on, self._safe_name(file.name)
                    )
        limit = self._max_images()
        if not with_images or self._images is None or limit <= 0:
            return notes
        newest = [f for f in files if is_image_file(f)][-limit:]
        # Downloads run side by side; the decodes take turns (bot/senses/seen_images.py).
        for seen in await asyncio.gather(*(self._images.see(file) for file in newest)):
            self._note(notes, seen)
        return notes

    @staticmethod
    def _note(notes: SenseNotes, seen: Seen) -> None:
        if seen.image is None:
            notes.image[seen.file.id] = f"(image not shown to you: {seen.refused})"
            return
        notes.shown.append((seen.file, seen.image))
        number = len(notes.shown)
        notes.image[seen.file.id] = f"(shown to you as image {number}, {seen.image.width}×{seen.image.height})"
