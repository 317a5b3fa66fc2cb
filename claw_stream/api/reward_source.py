"""Reward source: what scores each turn in the worker (and in `claw-stream replay`).

A user writes a `Scorer`, `fn(turn, metadata)`, sync or async, named in `worker.rewards`
(`use: module:function`, or `use: rule` with `function:`, or an entry point of the group
`claw_stream.rewards`); the worker runs it as a `RewardSource` with its name and timeout. The
built-in kinds (`rule`, `rm`, `external`, `reaction`) are `RewardSource`s too; `prm`, the
judge, is the worker's own. Docs: docs/extending/reward-source.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from claw_stream.events import SourceScore, Turn

__all__ = [
    "SCORER_ARGUMENTS",
    "Metadata",
    "RewardSource",
    "Score",
    "ScoreValue",
    "Scorer",
    "SourceScore",
    "Turn",
]


@dataclass(frozen=True)
class Score:
    score: float
    explanation: str | None = None


# the session's metadata: `started` then `reward` events' metadata, later keys winning
Metadata: TypeAlias = Mapping[str, Any]
# what a scorer returns: a number, a Score, (score, explanation), {"score", "explanation"},
# or None to abstain (the next signal in `worker.precedence` decides)
ScoreValue: TypeAlias = Score | float | tuple[float, str | None] | Mapping[str, Any] | None
Scorer: TypeAlias = Callable[[Turn, Metadata], ScoreValue | Awaitable[ScoreValue]]
SCORER_ARGUMENTS = ("turn", "metadata")  # how the worker calls a scorer, positionally


class RewardSource(Protocol):
    """One entry of `worker.rewards` as the worker runs it: `score` within `timeout_s`; an
    error or a timeout is recorded as the source's `SourceScore.error`, never fatal."""

    name: str
    timeout_s: float

    async def score(self, turn: Turn, metadata: Metadata) -> Score | None: ...

    async def aclose(self) -> None: ...
