"""`crewbot doctor`'s warm pool line: what the running bot last wrote of its pool (DATA_DIR/warm-pool.json)."""

from __future__ import annotations

from core.setting_runtime import RuntimeKind
from core.settings import Settings
from crewbot.doctor_result import CheckResult, fail
from runner.lifecycle.pool_status import describe, read_status, status_file
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import archives_dir


def _archived_chats(settings: Settings) -> int:
    try:
        return sum(1 for path in archives_dir(DataPaths(settings.data_dir)).glob("*.tar") if path.is_file())
    except OSError:
        return 0


PAUSED_FIX = (
    "runs start cold meanwhile; free memory or lower SUBAGENT_WARM_POOL (memory), or see `crewbot doctor`'s engine "
    "and image lines (engine errors); SUBAGENT_WARM_POOL=0 turns the pool off"
)


def check_pool(settings: Settings) -> CheckResult:
    if settings.subagent_warm_pool == 0:
        # Archived chats sync from their archive with the pool off too (runner/storage/workspace_placement.py):
        # said, not failed; nothing is hidden from them.
        kept = _archived_chats(settings) if settings.subagent_runtime is RuntimeKind.DOCKER else 0
        synced = f"; {kept} archived chat(s) sync their workspace from its archive" if kept else ""
        return CheckResult("ok", f"off (SUBAGENT_WARM_POOL=0): every run starts its container{synced}")
    if settings.subagent_runtime is RuntimeKind.KUBERNETES:
        return CheckResult("skip", "not on Kubernetes yet: runs start their pods cold")
    status = read_status(status_file(settings.data_dir))
    if status is None or not status[1]:
        return CheckResult("skip", f"the bot is not running (it keeps {settings.subagent_warm_pool} ready)")
    stats, _ = status
    if stats.paused:
        return fail(describe(stats), PAUSED_FIX)
    return CheckResult("ok", describe(stats))
