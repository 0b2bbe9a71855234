"""A finished run offers its result until the host takes it: a restart of the host does not lose it."""

from __future__ import annotations

import pytest

from container.__main__ import report
from container.channel import ChannelRefused
from container.task import RunResult

RESULT = RunResult(status="completed", result="42")


class FlakyHost:
    """Away for `away` attempts (its socket missing while it restarts), then takes the result or refuses it."""

    def __init__(self, away: int, refuse: bool = False) -> None:
        self.away = away
        self.refuse = refuse
        self.attempts = 0
        self.received: list[RunResult] = []

    async def report(self, result: RunResult) -> str:
        self.attempts += 1
        if self.attempts <= self.away:
            raise ConnectionError("the run channel does not answer")
        if self.refuse:
            raise ChannelRefused("run run-1 is cancelled or finished")
        self.received.append(result)
        return "received"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("container.channel.HOST_FIRST_RETRY_SECONDS", 0.01)
    monkeypatch.setattr("container.channel.HOST_MAX_RETRY_SECONDS", 0.02)


async def test_a_host_that_comes_back_gets_the_result() -> None:
    host = FlakyHost(away=3)
    assert await report(host, RESULT, "run-1") is True
    assert host.received == [RESULT] and host.attempts == 4


async def test_a_refusal_is_final(capsys: pytest.CaptureFixture[str]) -> None:
    host = FlakyHost(away=0, refuse=True)
    assert await report(host, RESULT, "run-1") is False
    assert host.attempts == 1
    assert "cancelled or finished" in capsys.readouterr().out


async def test_a_host_that_stays_away_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("container.channel.HOST_AWAY_SECONDS", 0.1)
    host = FlakyHost(away=10_000)
    assert await report(host, RESULT, "run-1") is False
    assert 2 <= host.attempts < 100
