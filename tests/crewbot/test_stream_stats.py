"""Streamed answers seen (issue 36 item 5): each settled answer's time to first visible text and its edits go to
the metrics (crewbot/stream_record.py) and to the store, and `crewbot stats` shows their median and p90 and the
edits per minute (crewbot/stream_stats.py); from the real app on real PTB against the fake Bot API."""

from __future__ import annotations

import json
from pathlib import Path

from core.store.streamed_answers import StreamedAnswer
from crewbot.stream_stats import compute_streams
from runner.lifecycle.metrics import RunMetrics
from tests.bot.agent.stream_rig import INTERVAL_SECONDS, streaming_bot, writes
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.fakes.llm_server import StreamPace, openai_text
from tests.harness import GROUP_ID

PACE = StreamPace(piece_chars=4, seconds_per_piece=0.02)
MODEL_WAIT_SECONDS = 0.3  # the fake LLM's wait before its first token: the first text cannot come sooner
ANSWER = "A streamed answer, long enough to be written in a few edits while the model goes on. " * 3


async def test_each_streamed_answer_is_counted_and_crewbot_stats_shows_them(tmp_path: Path) -> None:
    metrics = RunMetrics()
    async with streaming_bot(tmp_path, PACE, count_stream=metrics.count_stream) as (app, tg, llm):
        llm.set_delay(MODEL_WAIT_SECONDS)
        for number in range(2):
            llm.openai.enqueue(openai_text(ANSWER))
            tg.push_message(GROUP_ID, f"@{tg.bot_username} question {number}", first_name="Ann")
            await tg.wait_for_messages(GROUP_ID, number + 1)
            await app.wait_quiet(GROUP_ID)
        # Every write the chat saw, less the outbox's final edit of each answer (the final text, not growth).
        growing = len(writes(tg)) - 2
    assert growing >= 2  # each answer its first words at least (an edit more only if the stream outlasts the interval)

    def get(name: str, shown: str = "message") -> float | None:
        return metrics.registry.get_sample_value(name, {"shown": shown})

    assert get("crewbot_stream_first_text_seconds_count") == 2
    first_sum = get("crewbot_stream_first_text_seconds_sum")
    assert first_sum is not None and first_sum >= 2 * MODEL_WAIT_SECONDS
    assert get("crewbot_stream_edits_total") == growing
    assert get("crewbot_stream_edits_total", "draft") == 0

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = crewbot_env(tmp_path, STREAM_EDIT_INTERVAL_SECONDS=str(INTERVAL_SECONDS))
    done = run_crewbot(["stats", "--since", "1h", "--json"], env, cwd)
    assert done.returncode == 0, done.stderr
    streams = json.loads(done.stdout)["streams"]
    assert streams["answers"] == 2 and streams["drafts"] == 0 and streams["edits"] == growing
    assert MODEL_WAIT_SECONDS <= streams["first_text_p50_seconds"] <= streams["first_text_p90_seconds"]
    assert streams["edits_per_minute"] > 0
    assert streams["allowed_per_minute"] == 60 / INTERVAL_SECONDS

    done = run_crewbot(["stats", "--since", "1h"], env, cwd)
    assert done.returncode == 0, done.stderr
    assert "streamed answers: 2; first text visible: median " in done.stdout
    assert f"streamed edits: {growing}; " in done.stdout and f" allows {60 / INTERVAL_SECONDS:.0f})" in done.stdout

    done = run_crewbot(["stats", "--since", "1h", "--chat", "-42"], env, cwd)
    assert done.returncode == 0, done.stderr
    assert "streamed answers: none" in done.stdout


def _answer(first: float, writing: float, edits: int, draft: bool = False) -> StreamedAnswer:
    return StreamedAnswer(GROUP_ID, 0.0, first, writing, edits, draft)


def test_median_p90_and_edits_per_minute_while_written() -> None:
    answers = [_answer(float(n), 10.0, 6) for n in range(1, 10)] + [_answer(30.0, 0.0, 1, draft=True)]
    use = compute_streams(answers, interval_seconds=1.5)
    assert (use.answers, use.drafts, use.edits) == (10, 1, 55)
    assert use.first_text_p50_seconds == 5.5  # of 1..9 and 30
    assert use.first_text_p90_seconds == 9.0  # nearest rank: the 9th of 10
    # 9 answers of 5 edits after their first write in 10 s each; the one written at once adds neither.
    assert use.edits_per_minute == 30.0
    assert use.allowed_per_minute == 40.0


def test_no_streamed_answers_and_answers_written_at_once() -> None:
    assert compute_streams([], 2.0).answers == 0
    assert compute_streams([], 2.0).first_text_p50_seconds is None
    once = compute_streams([_answer(1.0, 0.0, 1)], 2.0)
    assert once.answers == 1 and once.edits_per_minute is None
