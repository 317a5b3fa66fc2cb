"""Dynamic sampling in `tasks run`: groups are drawn round the task set until enough of them
have signal; a group whose rewards are all equal is reported, not counted."""

from __future__ import annotations

import asyncio

from claw_stream.tasks.dataset import Task
from claw_stream.tasks.runner import Episode, RunOptions, RunReport, _until_signal


def _tasks(n: int) -> list[Task]:
    return [
        Task.model_validate(
            {
                "id": f"t{i}",
                "prompt": "What is 1 + 1?",
                "expected": "2",
                "checker": {"kind": "number"},
            }
        )
        for i in range(n)
    ]


def _play(rewards: dict[tuple[str, int], list[float | None]], report: RunReport):
    """Attempt k of a task's draw d gets rewards[(task, d)][k]."""

    async def one(task: Task, attempt: int, draw: int) -> Episode:
        await asyncio.sleep(0)
        group = f"run-{task.id}" + (f".{draw}" if draw else "")
        reward = rewards[(task.id, draw)][attempt]
        episode = Episode(task.id, group, f"{group}-{attempt}", attempt, reward, 0, 1, 0, "2")
        report.episodes.append(episode)
        return episode

    return one


def test_tasks_are_drawn_again_until_enough_groups_have_signal() -> None:
    tasks = _tasks(3)
    rewards: dict[tuple[str, int], list[float | None]] = {
        ("t0", 0): [-1.0, -1.0],  # all failed: no signal
        ("t1", 0): [1.0, -1.0],
        ("t2", 0): [1.0, 1.0],  # all passed: no signal
        ("t0", 1): [-1.0, 1.0],  # t0 drawn again, other seeds: signal
        ("t1", 1): [1.0, -1.0],
    }
    report = RunReport()
    opts = RunOptions(group_size=2, concurrency=2, signal_groups=2)
    asyncio.run(_until_signal(tasks, opts, _play(rewards, report)))
    groups = report.groups()
    # one group at a time (2 episodes at once, G = 2): stops at the second with signal
    assert list(groups) == ["run-t0", "run-t1", "run-t2", "run-t0.1"]
    assert sorted(report.flat_groups) == ["run-t0", "run-t2"]


def test_drawing_stops_at_max_draws_when_no_group_has_signal() -> None:
    tasks = _tasks(2)
    rewards = {(f"t{i}", d): [-1.0, -1.0] for i in range(2) for d in range(5)}
    report = RunReport()
    opts = RunOptions(group_size=2, concurrency=4, signal_groups=2, max_draws=5)
    asyncio.run(_until_signal(tasks, opts, _play(rewards, report)))  # type: ignore[arg-type]
    assert len(report.groups()) == 5 and len(report.flat_groups) == 5


def test_an_attempt_that_failed_before_scoring_gives_no_signal() -> None:
    tasks = _tasks(1)
    rewards: dict[tuple[str, int], list[float | None]] = {
        ("t0", 0): [None, 1.0],
        ("t0", 1): [1.0, -1.0],
    }
    report = RunReport()
    opts = RunOptions(group_size=2, concurrency=1, signal_groups=1)
    asyncio.run(_until_signal(tasks, opts, _play(rewards, report)))
    assert set(report.groups()) == {"run-t0", "run-t0.1"}
    assert report.flat_groups == []  # one scored reward is not a flat group either
