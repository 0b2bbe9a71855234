"""An aborted turn's cascade (crewbot/turn_recorder.py): the live runs' kills go out beside the turn's mark,
not after it, and a second sweep after the mark takes the runs that started meanwhile."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bot.ports.runs import RunInfo
from bot.turns.engine import AbortReason, Turn
from core.settings import CancelScope
from core.store import ChatStore
from core.store.db import Database
from core.store.runs import RunStatus
from core.store.turns import TurnStatus, TurnStore
from crewbot.turn_recorder import TurnRecorder

CHAT = -100


class MarkedTurns(TurnStore):
    """The real turn store, noting when a turn's end is written."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.ended = False

    async def end(self, turn_id: str, status: TurnStatus) -> bool:
        done = await super().end(turn_id, status)
        self.ended = True
        return done


class Sweeps:
    """The run control: each sweep notes whether the turn's end was written when it began (as the task
    manager asks its kills: before its first await)."""

    def __init__(self, turns: MarkedTurns) -> None:
        self._turns = turns
        self.began_after_mark: list[tuple[str, bool]] = []

    async def cancel_turn(self, turn_id: str, reason: str) -> int:
        self.began_after_mark.append(("turn", self._turns.ended))
        return 1 if len(self.began_after_mark) == 1 else 0

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        self.began_after_mark.append(("chat", self._turns.ended))
        return 2 if len(self.began_after_mark) == 1 else 1

    async def cancel_run(self, chat_id: int, run_id: str) -> RunStatus | None:
        raise AssertionError("not asked by a cascade")

    async def list_runs(self, chat_id: int, limit: int) -> Sequence[RunInfo]:
        return []


@pytest.mark.parametrize(
    ("scope", "reason", "kind"),
    [(CancelScope.TURN, AbortReason.MERGE, "turn"), (CancelScope.TURN, AbortReason.STOP, "chat")],
)
async def test_the_kills_go_out_beside_the_mark_and_a_second_sweep_follows_it(
    db: Database, scope: CancelScope, reason: AbortReason, kind: str
) -> None:
    await ChatStore(db).ensure(CHAT, "group", "main")
    turns = MarkedTurns(db)
    await turns.start("t1", CHAT)
    sweeps = Sweeps(turns)
    recorder = TurnRecorder(turns, scope, sweeps)

    await recorder.turn_aborted(Turn(id="t1", chat_id=CHAT, started_at=0.0), reason)

    assert sweeps.began_after_mark == [(kind, False), (kind, True)]
    assert await turns.status("t1") is TurnStatus.ABORTED
