"""The task dataset: one JSON object per line, validated with pydantic.

A line names the prompt, the tools a tool-call agent may call (Python functions by import
path), the files a terminal task starts with, and how the outcome is checked: an expected
answer (`exact`, `contains`, `number`), a file the agent must leave in its scratch directory
(`file`), or a Python checker by import path (`python`). A task may give partial credit
(`credit`) for the steps towards its answer: a well-formed tool call, the right tool, the right
arguments.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SHIPPED = ("arithmetic", "arithmetic-heldout", "brief", "brief-heldout", "files")
ImportPath = Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]


class _DatasetEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AnswerCheck(_DatasetEntry):
    """The final answer against `expected`: equal, containing it, or the same number."""

    kind: Literal["exact", "contains", "number"] = "exact"
    tolerance: float = Field(default=1e-6, ge=0, description="number: absolute tolerance")


class FileCheck(_DatasetEntry):
    """A file the agent must leave in its scratch directory, with this content."""

    kind: Literal["file"]
    path: str = Field(min_length=1)
    equals: str | None = None
    contains: str | None = None
    absent: bool = Field(default=False, description="The file must not exist (deleted).")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return _relative_path(value)


class WordsCheck(_DatasetEntry):
    """A stated output format: an answer of `min_words` to `max_words` words (split on spaces)
    that names `expected` (the question's subject), where a task gives it: a model that learns
    to be brief cannot pass with a word or two that say nothing."""

    kind: Literal["words"]
    min_words: int = Field(default=1, ge=1)
    max_words: int = Field(ge=1)

    @model_validator(mode="after")
    def _range(self) -> WordsCheck:
        if self.min_words > self.max_words:
            raise ValueError("min_words is more than max_words")
        return self


class PythonCheck(_DatasetEntry):
    """`module:function(answer: str, task: Task, scratch: Path | None) -> float` (the reward)."""

    kind: Literal["python"]
    function: ImportPath


Check = Annotated[AnswerCheck | FileCheck | WordsCheck | PythonCheck, Field(discriminator="kind")]


class ExpectedCall(_DatasetEntry):
    """The tool call a task wants; string arguments are compared without spaces or case."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Credit(_DatasetEntry):
    """Partial credit: shares of the reward for the steps towards the answer, the rest for the
    answer itself. The reward is -1 + 2 x the share earned: everything right is +1, as a pass,
    nothing right -1, as a failure, and a model that calls the right tool with the wrong
    arguments is told it got part of the way (the signal a small model lacks when nearly every
    attempt fails)."""

    well_formed: float = Field(
        default=0.0, ge=0, le=1, description="a tool call whose arguments are a JSON object"
    )
    tool: float = Field(default=0.0, ge=0, le=1, description="a call of `call.name`")
    arguments: float = Field(
        default=0.0, ge=0, le=1, description="a call of `call.name` with `call.arguments`"
    )
    call: ExpectedCall | None = None

    @model_validator(mode="after")
    def _shares(self) -> Credit:
        if self.well_formed + self.tool + self.arguments > 1:
            raise ValueError("the shares of well_formed, tool and arguments add up to more than 1")
        if (self.tool or self.arguments) and self.call is None:
            raise ValueError("credit for the tool or its arguments needs `call`")
        return self

    @property
    def answer(self) -> float:
        """The share for the right final answer: what the steps leave."""
        return 1.0 - self.well_formed - self.tool - self.arguments


def _relative_path(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{value!r} must be a path inside the scratch directory")
    return value


class Task(_DatasetEntry):
    id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    prompt: str = Field(min_length=1)
    system: str | None = None
    tools: list[ImportPath] = Field(
        default_factory=list, description="Python functions a tool-call agent may call."
    )
    expected: str | None = None
    checker: Check = Field(default_factory=AnswerCheck)
    files: dict[str, str] = Field(
        default_factory=dict, description="Terminal tasks: files the scratch directory starts with."
    )
    credit: Credit | None = Field(default=None, description="Partial credit (tool-call tasks).")

    @field_validator("files")
    @classmethod
    def _inside(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            _relative_path(path)
        return value

    @model_validator(mode="after")
    def _checkable(self) -> Task:
        if isinstance(self.checker, AnswerCheck) and self.expected is None:
            raise ValueError(f"checker {self.checker.kind!r} needs `expected`")
        if self.credit is not None and isinstance(self.checker, PythonCheck):
            raise ValueError("a python checker returns the reward itself: no `credit`")
        return self


class DatasetError(ValueError):
    """A dataset that cannot be read; the message names the file and line."""


def resolve_dataset(name_or_path: str) -> Path:
    """A shipped dataset by name (`arithmetic`, `files`) or a JSONL file."""
    if name_or_path in SHIPPED:
        return Path(
            str(resources.files("claw_stream.tasks") / "datasets" / f"{name_or_path}.jsonl")
        )
    path = Path(name_or_path)
    if not path.is_file():
        raise DatasetError(
            f"no dataset {name_or_path!r}: not a file, nor a shipped one ({', '.join(SHIPPED)})"
        )
    return path


def load_tasks(name_or_path: str, limit: int | None = None) -> list[Task]:
    path = resolve_dataset(name_or_path)
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = Task.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: not JSON ({exc.msg})") from None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<line>'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise DatasetError(f"{path}:{number}: {problems}") from None
        if task.id in seen:
            raise DatasetError(f"{path}:{number}: task id {task.id!r} appears twice")
        seen.add(task.id)
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise DatasetError(f"{path}: no tasks")
    return tasks
