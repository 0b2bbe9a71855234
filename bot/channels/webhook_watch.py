"""Webhook mode's start, watch and stop: the listener up first, then setWebhook (so Telegram's first
delivery finds it listening); then every WATCH_SECONDS a getWebhookInfo.

The watch is what can end webhook mode by itself, as a revoked token or a bug ends polling: a token Telegram
rejects, or a webhook no longer ours (another process with this bot's token deleted it to poll, or set its
own URL), after which Telegram delivers nothing here. Either is a failure of receiving (the bot is not ready
and exits, so that its supervisor restarts it, which sets the webhook again). Telegram's own delivery errors
(`last_error_message`: the proxy answered 502, the certificate was refused) are logged when a new one appears.

A plain stop leaves the webhook set: Telegram keeps what arrives meanwhile (up to a day) and delivers it to
the next start. Going back to polling deletes it at that start (TelegramChannel.start), without dropping
what is pending.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from telegram import Bot
from telegram.error import BadRequest, InvalidToken, RetryAfter

from bot.channels.polling import PollingTask
from bot.channels.webhook import Handle, WebhookConfig, WebhookListener, WebhookProblem
from bot.channels.webhook_guard import TELEGRAM_MAX_CONNECTIONS
from core.logging import get_logger

log = get_logger(__name__)

WATCH_SECONDS = 60.0
URL_FIX = (
    "TELEGRAM_WEBHOOK_URL must be a public https:// address with a certificate Telegram trusts, "
    "on port 443, 80, 88 or 8443"
)


class WebhookWatch:
    def __init__(self, bot: Bot, config: WebhookConfig, every_seconds: float, since: float) -> None:
        self._bot = bot
        self._config = config
        self._every_seconds = every_seconds
        # Telegram's errors from before this start are not news (its dates are whole seconds).
        self._seen_error_at = float(int(since) - 1)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._every_seconds)
            await self.check()

    async def check(self) -> None:
        try:
            info = await self._bot.get_webhook_info()
        except InvalidToken:
            log.critical("telegram_token_rejected")
            raise
        except RetryAfter:
            return
        except Exception as exc:  # Telegram or the network is down: the next check will tell
            log.warning("webhook_check_failed", error=str(exc), error_type=type(exc).__name__)
            return
        if info.url != self._config.url:
            raise WebhookProblem(
                f"Telegram no longer delivers to TELEGRAM_WEBHOOK_URL (its webhook is now {info.url or 'unset'}; "
                "another process with this bot's token polls or set its own URL)",
                "run one bot per token; starting this one again sets its webhook again",
            )
        error_at = info.last_error_date.timestamp() if info.last_error_date is not None else None
        if error_at is not None and error_at > self._seen_error_at:
            self._seen_error_at = error_at
            log.warning(
                "webhook_delivery_failed",
                error=info.last_error_message,
                pending_updates=info.pending_update_count,
                seconds_ago=round(max(time.time() - error_at, 0.0)),
                fix="Telegram could not deliver to TELEGRAM_WEBHOOK_URL: check the proxy reaches "
                f"{self._config.listen}, and its certificate",
            )


class WebhookReceiving:
    """The listener and its watch: stopped together; a failure is the watch's (as PollingTask's)."""

    def __init__(self, listener: WebhookListener, watch: PollingTask) -> None:
        self.listener = listener
        self._watch = watch

    @property
    def failure(self) -> BaseException | None:
        return self._watch.failure

    async def wait_failure(self) -> BaseException:
        return await self._watch.wait_failure()

    async def stop(self) -> None:
        """Stops listening; the webhook stays set (Telegram queues for the next start)."""
        await self._watch.stop()
        await self.listener.stop()


async def start_webhook(
    bot: Bot,
    config: WebhookConfig,
    handle: Handle,
    allowed_updates: Sequence[str],
    *,
    watch_seconds: float | None = None,  # WATCH_SECONDS
) -> WebhookReceiving:
    listener = WebhookListener(config, bot, handle)
    await listener.start()
    since = time.time()
    try:
        await bot.set_webhook(
            config.url,
            secret_token=config.secret,
            allowed_updates=list(allowed_updates),
            max_connections=TELEGRAM_MAX_CONNECTIONS,  # the listener holds this many and more (webhook_guard)
            drop_pending_updates=False,  # what arrived while the bot was down is still wanted
        )
    except BadRequest as exc:
        await listener.stop()
        raise WebhookProblem(f"Telegram refused the webhook {config.url} ({exc.message})", URL_FIX) from None
    except BaseException:
        await listener.stop()
        raise
    every = WATCH_SECONDS if watch_seconds is None else watch_seconds
    watch = PollingTask(WebhookWatch(bot, config, every, since), name="telegram-webhook", event="webhook_stopped")
    log.info("webhook_set", url=config.url, listen=config.listen, allowed_updates=list(allowed_updates))
    return WebhookReceiving(listener, watch)
