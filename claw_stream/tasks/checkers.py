"""Verifiable rewards: a task's checker turns an episode's outcome into its reward.

A passed check is reward +1, a failed one -1 (0 would carry no learning signal, and the
pipeline never spends a batch slot on it); a `python` checker returns the reward itself.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from claw_stream.tasks.dataset import AnswerCheck, FileCheck, PythonCheck, Task
from claw_stream.tasks.tools import import_function

PASS, FAIL = 1.0, -1.0
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands separators allowed), if any."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _answer_passes(check: AnswerCheck, expected: str, answer: str) -> bool:
    if check.kind == "exact":
        return answer.strip().casefold() == expected.strip().casefold()
    if check.kind == "contains":
        return expected.strip().casefold() in answer.casefold()
    got, want = last_number(answer), last_number(expected)
    return got is not None and want is not None and math.isclose(got, want, abs_tol=check.tolerance)


def _file_passes(check: FileCheck, scratch: Path | None) -> bool:
    if scratch is None:
        return False
    path = (scratch / check.path).resolve()
    if scratch.resolve() not in path.parents:
        return False
    if check.absent:
        return not path.exists()
    if not path.is_file():
        return False
    content = path.read_text(errors="replace")
    if check.equals is not None and content.strip() != check.equals.strip():
        return False
    return check.contains is None or check.contains in content


def score(task: Task, answer: str, scratch: Path | None = None) -> float:
    """The episode's reward: PASS / FAIL, or what a python checker says."""
    check = task.checker
    if isinstance(check, PythonCheck):
        reward = float(import_function(check.function)(answer, task, scratch))
        if not math.isfinite(reward):
            raise ValueError(f"checker {check.function} returned {reward}")
        return reward
    if isinstance(check, FileCheck):
        return PASS if _file_passes(check, scratch) else FAIL
    assert task.expected is not None  # the dataset validator makes sure
    return PASS if _answer_passes(check, task.expected, answer) else FAIL
