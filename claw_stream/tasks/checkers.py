"""Verifiable rewards: a task's checker turns an episode's outcome into its reward.

A passed check is reward +1, a failed one -1 (0 would carry no learning signal, and the
pipeline never spends a batch slot on it); a `python` checker, a `claw_stream.api.TaskChecker`
(docs/extending/task-checker.md), returns the reward itself. A
task with `credit` earns part of the reward for a well-formed tool call, the right tool and the
right arguments (`partial_credit`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from claw_stream.api.task_checker import CHECKER_ARGUMENTS, TaskChecker
from claw_stream.plugins import misfit
from claw_stream.tasks.dataset import AnswerCheck, Credit, FileCheck, PythonCheck, Task, WordsCheck
from claw_stream.tasks.tools import ToolError, import_function

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


def load_checker(task: Task, check: PythonCheck) -> TaskChecker:
    """A `python` checker's function, imported; ToolError naming the task and the function
    when it cannot be imported or called as `fn(answer, task, scratch)`."""
    function = import_function(check.function)
    if (problem := misfit(function, CHECKER_ARGUMENTS)) is not None:
        raise ToolError(f"task {task.id}: checker {check.function} {problem}")
    return function


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


def score(
    task: Task, answer: str, scratch: Path | None = None, calls: Sequence[tuple[str, str]] = ()
) -> float:
    """The episode's reward: PASS / FAIL, what a python checker says, or with `task.credit` the
    partial credit of the answer and the tool `calls` (name, arguments as sent) it made."""
    check = task.checker
    if isinstance(check, PythonCheck):
        reward = float(load_checker(task, check)(answer, task, scratch))
        if not math.isfinite(reward):
            raise ValueError(f"checker {check.function} returned {reward}")
        return reward
    if isinstance(check, FileCheck):
        passed = _file_passes(check, scratch)
    elif isinstance(check, WordsCheck):
        named = task.expected is None or task.expected.casefold() in answer.casefold()
        passed = named and check.min_words <= len(answer.split()) <= check.max_words
    else:
        assert task.expected is not None  # the dataset validator makes sure
        passed = _answer_passes(check, task.expected, answer)
    if task.credit is not None:
        return partial_credit(task.credit, passed, calls)
    return PASS if passed else FAIL


def partial_credit(credit: Credit, passed: bool, calls: Sequence[tuple[str, str]]) -> float:
    """-1 + 2 x the share earned: each step counts if any call of the episode made it."""
    parsed = [(name, args) for name, raw in calls if (args := _object(raw)) is not None]
    share = credit.well_formed * bool(parsed) + credit.answer * passed
    if credit.call is not None:
        named = [args for name, args in parsed if name == credit.call.name]
        share += credit.tool * bool(named)
        share += credit.arguments * any(_same(args, credit.call.arguments) for args in named)
    return FAIL + (PASS - FAIL) * share


def _object(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Every wanted argument given: strings without spaces or case, numbers by value."""

    def norm(value: Any) -> Any:
        if isinstance(value, str):
            return "".join(value.split()).casefold()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return value

    return all(key in got and norm(got[key]) == norm(value) for key, value in want.items())
