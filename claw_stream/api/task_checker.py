"""Task checker: a Python function that turns an episode's outcome into its reward.

Named by a dataset line's checker, `{"kind": "python", "function": "module:function"}`, and
called `fn(answer, task, scratch)`: the agent's last answer, the `Task` (the validated line,
`claw_stream.tasks.dataset.Task`), and the episode's scratch directory (terminal agent; None
otherwise). It returns the reward, a finite number (+1 passed, -1 failed, or anything
between). Docs: docs/extending/task-checker.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    # the dataset's model lives with the tasks library, which the contract does not import
    from claw_stream.tasks.dataset import Task

__all__ = ["CHECKER_ARGUMENTS", "TaskChecker"]

TaskChecker: TypeAlias = Callable[[str, "Task", Path | None], float]
CHECKER_ARGUMENTS = ("answer", "task", "scratch")
