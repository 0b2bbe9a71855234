"""Files as the fake Telegram keeps them: each posted or sent file's bytes under a file_id, the Bot API objects
that describe them in messages (Document, PhotoSize, Audio, Voice, Video, Animation) and getFile's File, and
records of what the bot sent and downloaded.

Every posting of a file gets a new file_id; its file_unique_id follows the kind and the bytes, so the same
bytes posted twice as the same kind share it, as on Telegram. Plain data with no locking of its own: the
fake holds its lock around every use.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import mimetypes
import secrets
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from tests.fakes.telegram_images import PhotoSizeData, photo_sizes
from tests.fakes.telegram_parsed import JsonDict

MediaKind = Literal["document", "photo", "audio", "voice", "video", "animation", "video_note", "sticker"]
MEDIA_KINDS: tuple[MediaKind, ...] = (
    "document",
    "photo",
    "audio",
    "voice",
    "video",
    "animation",
    "video_note",
    "sticker",
)
# The Bot API gives these no file name and no MIME type: a video note's length is its side, a sticker's size its
# pixels and kind.
_BARE_KINDS = ("video_note", "sticker")
DEFAULT_STICKER = {"width": 512, "height": 512, "is_animated": False, "is_video": False, "type": "regular"}

MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # getFile: "file is too big" above 20 MB
MAX_UPLOAD_BYTES = 50 * 1024 * 1024  # sendDocument and friends: 50 MB per file
DEFAULT_DURATION_SECONDS = 1
DEFAULT_VIDEO_SIZE = (640, 360)
OCTET_STREAM = "application/octet-stream"

# Where Telegram's file_path puts each kind, and the type tag its file_ids start with.
_FOLDERS: dict[MediaKind, str] = {
    "document": "documents",
    "photo": "photos",
    "audio": "music",
    "voice": "voice",
    "video": "videos",
    "animation": "animations",
    "video_note": "video_notes",
    "sticker": "stickers",
}
_ID_PREFIXES: dict[MediaKind, str] = {
    "document": "BQACAgIAAxkBAAI",
    "photo": "AgACAgIAAxkBAAI",
    "audio": "CQACAgIAAxkBAAI",
    "voice": "AwACAgIAAxkBAAI",
    "video": "BAACAgIAAxkBAAI",
    "animation": "CgACAgIAAxkBAAI",
    "video_note": "DQACAgIAAxkBAAI",
    "sticker": "CAACAgIAAxkBAAI",
}
_DEFAULT_MIME_TYPES: dict[MediaKind, str] = {
    "document": OCTET_STREAM,
    "audio": "audio/mpeg",
    "voice": "audio/ogg",
    "video": "video/mp4",
    "animation": "video/mp4",
}
_DEFAULT_EXTENSIONS: dict[MediaKind, str] = {
    "audio": ".mp3",
    "voice": ".oga",
    "video": ".mp4",
    "animation": ".mp4",
    "video_note": ".mp4",
    "sticker": ".webp",
}


@dataclass
class StoredFile:
    """One file_id and the bytes behind it."""

    file_id: str
    file_unique_id: str
    kind: MediaKind
    data: bytes
    file_path: str  # relative, as getFile answers it: "documents/file_3.pdf"
    file_name: str | None = None
    mime_type: str | None = None
    forgotten: bool = False  # getFile answers "invalid file_id", the download 404

    def file_object(self) -> JsonDict:
        """getFile's answer: a File."""
        return {
            "file_id": self.file_id,
            "file_unique_id": self.file_unique_id,
            "file_size": len(self.data),
            "file_path": self.file_path,
        }


@dataclass(frozen=True)
class SentFile:
    """One successful sendDocument or sendPhoto."""

    method: str  # "sendDocument" or "sendPhoto"
    chat_id: int
    message_id: int
    data: bytes  # as uploaded (or the stored bytes of a file_id sent again)
    file_name: str | None  # the upload's file name
    mime_type: str | None  # the upload's Content-Type, if it had one
    caption: str | None  # as the bot sent it
    parse_mode: str | None
    plain_caption: str | None  # as users see it, after parse_mode
    caption_entities: list[JsonDict]
    reply_to_message_id: int | None
    thread_id: int | None  # the forum topic it went to
    reply_markup: Any
    file_id: str  # the document, or the photo's largest size
    file_unique_id: str
    message: JsonDict  # the Message object returned to the bot
    at: float  # time.monotonic()


@dataclass(frozen=True)
class FileDownload:
    """One request for a known file's URL, whether served whole or with a fault."""

    file_id: str
    file_path: str
    fault: str | None  # the injected fault's kind ("truncate", ...), None when served whole
    at: float  # time.monotonic()


def document_mime_type(file_name: str | None, given: str | None, kind: MediaKind = "document") -> str:
    """The mime_type Telegram reports: the one given (unless octet-stream), else guessed from the name."""
    if given and given != OCTET_STREAM:
        return given
    guessed = mimetypes.guess_type(file_name, strict=False)[0] if file_name else None
    return guessed or _DEFAULT_MIME_TYPES.get(kind, OCTET_STREAM)


@dataclass
class FileStore:
    files: dict[str, StoredFile] = field(default_factory=dict)  # by file_id
    paths: dict[str, StoredFile] = field(default_factory=dict)  # by file_path
    sent: list[SentFile] = field(default_factory=list)
    downloads: list[FileDownload] = field(default_factory=list)
    count: int = 0

    def add(
        self,
        kind: MediaKind,
        data: bytes,
        *,
        file_name: str | None = None,
        mime_type: str | None = None,
        extension: str | None = None,
    ) -> StoredFile:
        """A new file_id for these bytes (its file_unique_id follows kind and bytes)."""
        self.count += 1
        digest = hashlib.sha256(kind.encode() + b"\0" + data).digest()
        unique_id = "AgAD" + base64.urlsafe_b64encode(digest[:9]).decode()
        token = base64.urlsafe_b64encode(self.count.to_bytes(4, "big") + secrets.token_bytes(32)).decode()
        file_id = _ID_PREFIXES[kind] + token.rstrip("=")
        suffix = extension or (PurePosixPath(file_name).suffix if file_name else "")
        if not suffix:
            suffix = _DEFAULT_EXTENSIONS.get(kind) or mimetypes.guess_extension(mime_type or "") or ""
        path = f"{_FOLDERS[kind]}/file_{self.count}{suffix}"
        stored = StoredFile(file_id, unique_id, kind, data, path, file_name, mime_type)
        self.files[file_id] = stored
        self.paths[path] = stored
        return stored

    def known(self, file_id: str) -> StoredFile | None:
        """The file behind a file_id the fake has not forgotten."""
        stored = self.files.get(file_id)
        return stored if stored is not None and not stored.forgotten else None

    def at_path(self, file_path: str) -> StoredFile | None:
        stored = self.paths.get(file_path)
        return stored if stored is not None and not stored.forgotten else None

    # --- the objects in messages ----------------------------------------------------------------

    def photo(self, data: bytes | list[PhotoSizeData]) -> list[JsonDict]:
        """A photo's PhotoSize list, smallest first, from its bytes (PhotoError if Telegram would refuse
        them) or from the sizes photo_sizes() made of them."""
        sizes: list[JsonDict] = []
        for size in photo_sizes(data) if isinstance(data, bytes) else data:
            stored = self.add("photo", size.data, extension=size.extension)
            sizes.append(
                {
                    "file_id": stored.file_id,
                    "file_unique_id": stored.file_unique_id,
                    "file_size": len(size.data),
                    "width": size.width,
                    "height": size.height,
                }
            )
        return sizes

    def media(
        self,
        kind: MediaKind,
        data: bytes,
        *,
        file_name: str | None = None,
        mime_type: str | None = None,
        details: JsonDict | None = None,
    ) -> JsonDict:
        """The message fields that carry a new file: {"document": ...}, {"photo": [...]}, ...

        `details` go into the object (duration, width, height, performer, title, thumbnail, ...) over the
        defaults; an animation's message also has it as `document`, as the Bot API keeps for compatibility.
        """
        if kind == "photo":
            if file_name is not None or mime_type is not None or details:
                raise ValueError("a photo has no file name, MIME type or details; Telegram keeps only its sizes")
            return {"photo": self.photo(data)}
        if kind in ("voice", *_BARE_KINDS) and file_name is not None:
            raise ValueError(f"a {kind} message has no file name in the Bot API")
        mime = document_mime_type(file_name, mime_type, kind)
        stored = self.add(kind, data, file_name=file_name, mime_type=mime)
        media: JsonDict = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id}
        if kind in ("video", "animation"):
            media.update(width=DEFAULT_VIDEO_SIZE[0], height=DEFAULT_VIDEO_SIZE[1])
        if kind == "video_note":
            media["length"] = DEFAULT_VIDEO_SIZE[1]
        if kind == "sticker":
            media.update(DEFAULT_STICKER)
        elif kind != "document":
            media["duration"] = DEFAULT_DURATION_SECONDS
        media.update(copy.deepcopy(details or {}))
        if file_name is not None:
            media["file_name"] = file_name
        if kind not in _BARE_KINDS:
            media["mime_type"] = mime
        media["file_size"] = len(data)
        fields: JsonDict = {kind: media}
        if kind == "animation":
            fields["document"] = {
                key: media[key]
                for key in ("file_id", "file_unique_id", "thumbnail", "file_name", "mime_type", "file_size")
                if key in media
            }
        return fields
