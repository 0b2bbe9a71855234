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
        kept = _archived_chats(settings)
        if kept and settings.subagent_runtime is RuntimeKind.DOCKER:
            return fail(
                f"off, but {kept} chat(s) keep their workspace in an archive from when the pool was on, "
                "which runs without a pool do not see",
                "set SUBAGENT_WARM_POOL above 0 again (runs then sync the archives), or copy the files out of "
                "DATA_DIR/workspace-archives/<chat>.tar into DATA_DIR/workspaces/<chat>/ and remove the archive",
            )
        return CheckResult("ok", "off (SUBAGENT_WARM_POOL=0): every run starts its container")
    if settings.subagent_runtime is RuntimeKind.KUBERNETES:
        return CheckResult("skip", "not on Kubernetes yet: runs start their pods cold")
    status = read_status(status_file(settings.data_dir))
    if status is None or not status[1]:
        return CheckResult("skip", f"the bot is not running (it keeps {settings.subagent_warm_pool} ready)")
    stats, _ = status
    if stats.paused:
        return fail(describe(stats), PAUSED_FIX)
    return CheckResult("ok", describe(stats))
