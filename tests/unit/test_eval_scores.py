"""An eval run's score per answering version: a swap mid-run splits it, failures not scored."""

from __future__ import annotations

from datetime import UTC, datetime

from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.service import scores_of
from claw_stream.tasks.runner import Episode, RunReport


def episode(task: str, version: int, reward: float | None) -> Episode:
    error = None if reward is not None else "GatewayError: 503"
    return Episode(task, f"g-{task}", f"s-{task}", 0, reward, version, 1, 0, "", error)


def test_a_swap_during_a_run_gives_one_row_per_version() -> None:
    report = RunReport(
        [
            episode("a", 3, 1.0),
            episode("b", 3, -1.0),
            episode("c", 3, None),
            episode("d", 4, 1.0),
        ]
    )
    rows = scores_of(report, "eval-x", "policy", EvalSettings(), datetime.now(UTC))
    assert [(r.version, r.n_episodes, r.n_passed, r.n_failed) for r in rows] == [
        (3, 3, 1, 1),
        (4, 1, 1, 0),
    ]
    assert rows[0].score == 0.5 and rows[0].mean_reward == 0.0
    assert rows[1].score == 1.0 and rows[0].dataset == "arithmetic-heldout"
