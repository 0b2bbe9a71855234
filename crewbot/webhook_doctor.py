"""`crewbot doctor`'s webhook line: what getWebhookInfo says (where Telegram delivers, updates pending, its last
delivery error) read against the mode the settings ask for, and the fix when the two disagree.

Webhook mode (TELEGRAM_WEBHOOK_URL set): Telegram should deliver to that URL. A delivery error in the last
RECENT_ERROR_SECONDS is a failure (Telegram retries a failing update within about a minute, so an error that old
is still going on); an older one is shown, as history. No webhook set yet is fine: `crewbot run` sets it.
Polling mode: any webhook set is a failure, since Telegram then refuses getUpdates (409).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

RECENT_ERROR_SECONDS = 600
MAX_ERROR_CHARS = 160
SECRET_FIX = (
    "Telegram's secret differs from TELEGRAM_WEBHOOK_SECRET (changed without a restart?): restart crewbot, which "
    "sets the webhook with its secret"
)
TLS_FIX = "the proxy's certificate: Telegram needs one from a public CA for the URL's host (deploy/Caddyfile gets one)"


@dataclass(frozen=True, slots=True)
class WebhookFacts:
    """getWebhookInfo's fields, as PTB gives them (dates as Unix seconds)."""

    url: str
    pending: int
    last_error_at: float | None = None
    last_error: str | None = None


def webhook_verdict(
    facts: WebhookFacts, wanted_url: str | None, listen: str, now: float | None = None
) -> tuple[str, str, str | None]:
    """(status, detail, fix) of the doctor's webhook line: ok or FAIL, and a fix for every FAIL."""
    now = time.time() if now is None else now
    pending = f"{facts.pending} update{'' if facts.pending == 1 else 's'} pending"
    error, recent = _last_error(facts, now)
    if wanted_url is None:
        if not facts.url:
            return "ok", f"no webhook set: long polling ({pending})", None
        return (
            "FAIL",
            f"a webhook is set ({facts.url}; {pending}), so Telegram refuses getUpdates and polling gets nothing",
            "if no other bot uses this token in webhook mode, `crewbot run` deletes it at start (nothing pending is "
            "lost); else set TELEGRAM_WEBHOOK_URL here too, or stop that bot",
        )
    if not facts.url:
        return "ok", f"no webhook set yet: `crewbot run` sets {wanted_url} at start ({pending})", None
    if facts.url != wanted_url:
        return (
            "FAIL",
            f"Telegram delivers to {facts.url}, not to TELEGRAM_WEBHOOK_URL {wanted_url} ({pending})",
            "another bot with this token set it: run one bot per token; `crewbot run` here sets the URL at start",
        )
    if recent:
        return "FAIL", f"Telegram cannot deliver to {wanted_url} ({pending}; {error})", _fix_for(facts, listen)
    return "ok", f"Telegram delivers to {wanted_url} ({pending}{'; ' + error if error else ''})", None


def _last_error(facts: WebhookFacts, now: float) -> tuple[str, bool]:
    if facts.last_error_at is None:
        return "", False
    age = max(now - facts.last_error_at, 0.0)
    words = " ".join((facts.last_error or "unknown").split())[:MAX_ERROR_CHARS]
    return f"last error {_age(age)} ago: {words}", age <= RECENT_ERROR_SECONDS


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} days"


def _fix_for(facts: WebhookFacts, listen: str) -> str:
    error = (facts.last_error or "").lower()
    if "403" in error or "401" in error:
        return SECRET_FIX
    if "ssl" in error or "certificate" in error:
        return TLS_FIX
    return (
        f"check that crewbot runs and the reverse proxy forwards the URL to TELEGRAM_WEBHOOK_LISTEN={listen} "
        "(deploy/Caddyfile, deploy/nginx-webhook.conf)"
    )
