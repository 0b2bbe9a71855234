"""The senses assembled from settings: the window's transcripts and images for the main agent's prompt, and the
transcriber when speech to text is set up (STT_BASE_URL)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.senses.seen_images import FileDownloader, SeenImages
from bot.senses.sent_photos import SentOrPosted
from bot.senses.stt_client import SttClient
from bot.senses.transcriber import Transcriber
from bot.senses.window import WindowSenses
from container.file_names import safe_file_name
from core.allowances import Allowances
from core.logging import get_logger
from core.settings import Settings
from core.stores import Stores
from runner.storage.paths import DataPaths

log = get_logger(__name__)


def stt_client(settings: Settings) -> SttClient | None:
    if settings.stt_base_url is None:
        return None
    key = settings.stt_api_key.get_secret_value() if settings.stt_api_key is not None else None
    return SttClient(settings.stt_base_url, settings.stt_model, api_key=key, language=settings.stt_language)


@dataclass(slots=True)
class Senses:
    window: WindowSenses
    transcriber: Transcriber | None

    async def start(self, stores: Stores) -> None:
        interrupted = await stores.transcripts.close_interrupted()
        if interrupted:
            log.info("transcriptions_interrupted_by_restart", count=interrupted)

    async def close(self) -> None:
        if self.transcriber is not None:
            await self.transcriber.close()


def build_senses(settings: Settings, stores: Stores, channel: FileDownloader, allowances: Allowances) -> Senses:
    client = stt_client(settings)
    transcriber = Transcriber(settings, client, stores.transcripts, channel, allowances) if client else None
    paths = DataPaths(settings.data_dir)
    window = WindowSenses(
        stores.transcripts,
        SeenImages(paths.files_seen_dir, SentOrPosted(channel, paths.files_out_dir)),
        max_images=lambda: settings.vision_max_images,
        stt_on=client is not None,
        safe_name=safe_file_name,
    )
    return Senses(window, transcriber)
