"""The fake Bot API's file methods: getFile, and sendDocument and sendPhoto (multipart uploads as PTB sends them,
or a known file_id sent again), with Telegram's validation and error descriptions."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any

from tests.fakes.telegram_chat_methods import find_chat
from tests.fakes.telegram_files import (
    MAX_DOWNLOAD_BYTES,
    MAX_UPLOAD_BYTES,
    SentFile,
    StoredFile,
    document_mime_type,
)
from tests.fakes.telegram_http import UploadedFile
from tests.fakes.telegram_images import PhotoError, PhotoSizeData, photo_sizes
from tests.fakes.telegram_message_methods import reply_target, topic_thread
from tests.fakes.telegram_params import ApiError, Handler, Params, bad_request
from tests.fakes.telegram_parsed import EntityParseError, ParsedText
from tests.fakes.telegram_state import JsonDict, TelegramData
from tests.fakes.telegram_text import parse_text
from tests.fakes.waiting import Watch

MAX_CAPTION_CHARS = 1024
WRONG_FILE_DESCRIPTION = "wrong file identifier/HTTP URL specified"


@dataclass(frozen=True)
class _Outgoing:
    chat: JsonDict
    caption: ParsedText | None
    reply_to: JsonDict | None
    thread: int | None


class FileMethods:
    """The file methods over TelegramData; every read or write holds `lock`."""

    def __init__(self, data: TelegramData, lock: threading.RLock, watch: Watch, *, strict_html: bool) -> None:
        self._data = data
        self._lock = lock
        self._watch = watch
        self._strict_html = strict_html

    def handlers(self) -> dict[str, Handler]:
        return {"getFile": self.get_file, "sendDocument": self.send_document, "sendPhoto": self.send_photo}

    async def get_file(self, params: Params) -> Any:
        with self._lock:
            stored = self._data.files.known(params.string("file_id") or "")
            if stored is None:
                raise bad_request("invalid file_id")
            if len(stored.data) > MAX_DOWNLOAD_BYTES:
                raise bad_request("file is too big")
            return stored.file_object()

    async def send_document(self, params: Params) -> Any:
        upload = params.raw.get("document")
        with self._lock:
            outgoing = self._outgoing(params)
            reused = self._reused(upload, "document")
            if reused is not None:
                data, file_name, given_mime = reused.data, reused.file_name, None
                mime = reused.mime_type
            else:
                data, file_name, given_mime = _upload(upload, "document")
                mime = document_mime_type(file_name, given_mime)
            fields = self._data.files.media("document", data, file_name=file_name, mime_type=mime)
            return self._send("sendDocument", params, outgoing, fields, data, file_name, given_mime)

    async def send_photo(self, params: Params) -> Any:
        upload = params.raw.get("photo")
        sizes: list[PhotoSizeData] | PhotoError | None = None
        if isinstance(upload, UploadedFile) and upload.data:
            try:  # Pillow's work outside the lock; its verdict counts after the chat's and the caption's
                sizes = photo_sizes(upload.data)
            except PhotoError as exc:
                sizes = exc
        with self._lock:
            outgoing = self._outgoing(params)
            reused = self._reused(upload, "photo")
            if reused is not None:
                data, file_name, given_mime = reused.data, None, None
                sizes = photo_sizes(reused.data)
            else:
                data, file_name, given_mime = _upload(upload, "photo")
            if isinstance(sizes, PhotoError):
                raise bad_request(str(sizes))
            assert sizes is not None
            fields: JsonDict = {"photo": self._data.files.photo(sizes)}
            if params.flag("has_spoiler"):
                fields["has_media_spoiler"] = True
            return self._send("sendPhoto", params, outgoing, fields, data, file_name, given_mime)

    def _reused(self, upload: object, kind: str) -> StoredFile | None:
        """The stored file of a file_id sent again; None for an upload. Unknown, forgotten (or a URL, which
        the fake does not fetch): 400, as is a photo's file_id sent as a document or the other way round."""
        if isinstance(upload, UploadedFile) or upload is None or upload == "":
            return None
        stored = self._data.files.known(str(upload))
        if stored is None:
            raise bad_request(WRONG_FILE_DESCRIPTION)
        if (kind == "photo") != (stored.kind == "photo"):
            raise bad_request("type of file mismatch")
        return stored

    def _caption(self, params: Params) -> ParsedText | None:
        caption = params.string("caption")
        if not caption:
            return None
        parse_mode = params.string("parse_mode")
        try:
            parsed = parse_text(caption, parse_mode, strict_html=self._strict_html)
        except EntityParseError as exc:
            raise bad_request(f"can't parse entities: {exc}") from None
        except ValueError:
            raise bad_request("unsupported parse_mode") from None
        if not parse_mode:
            entities = params.json("caption_entities")
            parsed.entities = copy.deepcopy(entities) if isinstance(entities, list) else []
        if len(parsed.text) > MAX_CAPTION_CHARS:
            raise bad_request("message caption is too long")
        return parsed if parsed.text.strip() else None

    def _outgoing(self, params: Params) -> _Outgoing:
        """What every send checks before its file: chat, caption, reply and topic."""
        chat = find_chat(self._data, params)
        caption = self._caption(params)
        return _Outgoing(chat, caption, reply_target(self._data, chat["id"], params), topic_thread(chat, params))

    def _send(
        self,
        method: str,
        params: Params,
        outgoing: _Outgoing,
        fields: JsonDict,
        data: bytes,
        file_name: str | None,
        given_mime: str | None,
    ) -> JsonDict:
        chat, caption, reply_to, thread = outgoing.chat, outgoing.caption, outgoing.reply_to, outgoing.thread
        message: JsonDict = {
            "message_id": self._data.next_message_id(chat["id"]),
            "from": self._data.user(self._data.bot_id),
            "chat": copy.deepcopy(chat),
            "date": self._data.now(),
            **fields,
        }
        if caption is not None:
            message["caption"] = caption.text
            if caption.entities:
                message["caption_entities"] = caption.entities
            if params.flag("show_caption_above_media"):
                message["show_caption_above_media"] = True
        if reply_to is not None:
            message["reply_to_message"] = reply_to
        if thread is not None:
            message.update(message_thread_id=thread, is_topic_message=True)
        markup = params.json("reply_markup")
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            message["reply_markup"] = markup  # Telegram echoes inline keyboards only
        self._data.store(message)
        media = fields["document"] if "document" in fields else fields["photo"][-1]
        self._data.files.sent.append(
            SentFile(
                method=method,
                chat_id=chat["id"],
                message_id=message["message_id"],
                data=data,
                file_name=file_name,
                mime_type=given_mime,
                caption=params.string("caption") or None,
                parse_mode=params.string("parse_mode"),
                plain_caption=caption.text if caption is not None else None,
                caption_entities=copy.deepcopy(caption.entities) if caption is not None else [],
                reply_to_message_id=reply_to["message_id"] if reply_to else None,
                thread_id=thread,
                reply_markup=markup,
                file_id=media["file_id"],
                file_unique_id=media["file_unique_id"],
                message=copy.deepcopy(message),
                at=time.monotonic(),
            )
        )
        self._watch.notify()
        return message


def _upload(upload: object, field: str) -> tuple[bytes, str | None, str | None]:
    """An uploaded file's bytes, name and Content-Type (None when it had none)."""
    if upload is None or upload == "":
        raise bad_request(f"there is no {field} in the request")
    if not isinstance(upload, UploadedFile):
        raise bad_request(WRONG_FILE_DESCRIPTION)
    if not upload.data:
        raise bad_request("file must be non-empty")
    if len(upload.data) > MAX_UPLOAD_BYTES:
        raise ApiError(413, "Request Entity Too Large")
    return upload.data, upload.filename or None, upload.content_type or None
