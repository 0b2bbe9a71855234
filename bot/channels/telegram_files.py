"""Files on Telegram: what a message carries (kept by reference), downloading one by its `file_id` when a
run needs it, and sending a run's file to a chat as a photo or a document."""

from __future__ import annotations

import asyncio
import datetime as dt
import warnings
from pathlib import Path

from telegram import Bot, InputFile, Message, ReplyParameters
from telegram.error import BadRequest, TelegramError
from telegram.warnings import PTBDeprecationWarning

from core.logging import get_logger
from core.outbox import DeliveryError
from core.store.chat_files import FileKind, FileUnavailable, NewFile
from core.store.outbox import OutgoingFile, SentFileKind

log = get_logger(__name__)

MAX_CAPTION_CHARS = 1_024  # Telegram's limit for a caption
# Telegram serves bots files up to 20 MB (a local Bot API server more); a bigger declared size is refused unread.
DOWNLOAD_TIMEOUT_SECONDS = 120.0
# Telegram names no file for these: the stored name says what it is.
_DEFAULT_NAMES = {
    FileKind.PHOTO: ("photo", ".jpg", "image/jpeg"),
    FileKind.VOICE: ("voice", ".ogg", "audio/ogg"),
    FileKind.VIDEO: ("video", ".mp4", "video/mp4"),
    FileKind.ANIMATION: ("animation", ".mp4", "video/mp4"),
    FileKind.AUDIO: ("audio", ".mp3", "audio/mpeg"),
    FileKind.DOCUMENT: ("document", "", None),
    FileKind.VIDEO_NOTE: ("video_note", ".mp4", "video/mp4"),
}
# A sticker is a still WebP, an animated Lottie (.tgs) or a video (.webm): only a still one is an image.
_STICKER_FORMATS = {
    "still": (".webp", "image/webp"),
    "animated": (".tgs", "application/x-tgsticker"),
    "video": (".webm", "video/webm"),
}


def file_of(message: Message) -> NewFile | None:
    """The file a message carries, if it is one a subagent can work on; a photo by its largest size."""
    # An animation first: Telegram sends its message with a `document` too, for old clients.
    kinds = (FileKind.ANIMATION, FileKind.DOCUMENT, FileKind.AUDIO, FileKind.VIDEO, FileKind.VOICE, FileKind.VIDEO_NOTE)
    for kind in kinds:
        media = getattr(message, kind.value, None)
        if media is not None:
            stem, extension, mime = _DEFAULT_NAMES[kind]
            name = getattr(media, "file_name", None) or f"{stem}_{message.message_id}{extension}"
            return NewFile(
                kind=kind,
                file_id=media.file_id,
                file_unique_id=media.file_unique_id,
                name=name,
                mime_type=getattr(media, "mime_type", None) or mime,
                size_bytes=media.file_size,
                duration_seconds=_duration(media),
            )
    if message.sticker is not None:
        sticker = message.sticker
        form = "animated" if sticker.is_animated else "video" if sticker.is_video else "still"
        extension, mime = _STICKER_FORMATS[form]
        return NewFile(
            kind=FileKind.STICKER,
            file_id=sticker.file_id,
            file_unique_id=sticker.file_unique_id,
            name=f"sticker_{message.message_id}{extension}",
            mime_type=mime,
            size_bytes=sticker.file_size,
        )
    if message.photo:
        largest = max(message.photo, key=lambda size: (size.width * size.height, size.file_size or 0))
        return NewFile(
            kind=FileKind.PHOTO,
            file_id=largest.file_id,
            file_unique_id=largest.file_unique_id,
            name=f"photo_{message.message_id}.jpg",
            mime_type="image/jpeg",
            size_bytes=largest.file_size,
        )
    return None


def _duration(media: object) -> int | None:
    """A media's duration as whole seconds: PTB 22 gives an int (warning that a timedelta will come), or a timedelta
    when asked to (PTB_TIMEDELTA)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        duration = getattr(media, "duration", None)
    if isinstance(duration, dt.timedelta):
        return int(duration.total_seconds())
    return duration if isinstance(duration, int) and duration >= 0 else None


async def download(bot: Bot, file_id: str, max_bytes: int) -> bytes:
    """The file's bytes (getFile, then its file URL); FileUnavailable says why not."""
    try:
        found = await bot.get_file(file_id)
    except BadRequest as exc:
        raise FileUnavailable(f"Telegram no longer has it ({exc.message})") from None
    except TelegramError as exc:
        raise FileUnavailable(f"Telegram did not hand it out: {exc}") from None
    if found.file_size is not None and found.file_size > max_bytes:
        raise FileUnavailable(f"it has {found.file_size} bytes, over the limit of {max_bytes}")
    if not found.file_path:
        raise FileUnavailable("Telegram gave no path to download it from")
    try:
        if Path(found.file_path).is_absolute():
            # A local Bot API server in --local mode names a file on its own disk instead of a URL.
            data = await asyncio.to_thread(_read_local, Path(found.file_path), max_bytes)
        else:
            data = bytes(await found.download_as_bytearray(read_timeout=DOWNLOAD_TIMEOUT_SECONDS))
    except (TelegramError, OSError) as exc:
        raise FileUnavailable(f"the download failed: {exc}") from None
    if len(data) > max_bytes:
        raise FileUnavailable(f"it has {len(data)} bytes, over the limit of {max_bytes}")
    if found.file_size is not None and len(data) != found.file_size:
        raise FileUnavailable(f"the download ended after {len(data)} of {found.file_size} bytes")
    return data


def _read_local(path: Path, max_bytes: int) -> bytes:
    with path.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"{path} is over the limit of {max_bytes} bytes")
    return data


async def send_file(
    bot: Bot,
    chat_id: int,
    thread_id: int | None,
    file: OutgoingFile,
    caption: str,
    reply: ReplyParameters | None,
) -> int:
    """Send it as its kind says; a photo Telegram refuses to process goes again as a document."""
    try:
        data = await asyncio.to_thread(file.path.read_bytes)  # host-only storage, at most SUBAGENT_MAX_FILE_MB
    except OSError as exc:
        # Pruned or lost (a restored backup): retrying cannot bring it back.
        raise DeliveryError(f"the file {file.name} is no longer kept: {exc.strerror or exc}", permanent=True) from exc
    text = caption[:MAX_CAPTION_CHARS] or None
    if file.kind is SentFileKind.PHOTO:
        try:
            sent = await bot.send_photo(
                chat_id,
                InputFile(data, filename=file.name),
                caption=text,
                message_thread_id=thread_id,
                reply_parameters=reply,
            )
            return int(sent.message_id)
        except BadRequest as exc:
            if not _photo_refused(exc):
                raise
            log.warning("photo_refused_sending_document", chat_id=chat_id, name=file.name, error=str(exc))
    sent = await bot.send_document(
        chat_id,
        InputFile(data, filename=file.name),
        caption=text,
        message_thread_id=thread_id,
        reply_parameters=reply,
        disable_content_type_detection=True,
    )
    return int(sent.message_id)


def _photo_refused(exc: BadRequest) -> bool:
    reason = exc.message.upper()
    return any(marker in reason for marker in ("IMAGE_PROCESS_FAILED", "PHOTO_", "DIMENSIONS", "WRONG TYPE"))
