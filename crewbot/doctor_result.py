"""One line of `crewbot doctor`: a check's status, what it found, and the fix when it failed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CheckResult:
    status: str  # ok, FAIL, skip
    detail: str
    fix: str | None = None  # every FAIL has one


def fail(detail: str, fix: str) -> CheckResult:
    return CheckResult("FAIL", detail, fix)


def render(name: str, result: CheckResult) -> str:
    fix = f"; fix: {result.fix}" if result.fix else ""
    return f"{result.status:<4} {name:<9} {result.detail}{fix}"
