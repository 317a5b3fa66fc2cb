"""The learning report put together from rows read out of Postgres: per version, its held-out
curve against the first and the previous version, its live turns (the judge's votes, the
user's feedback and explicit rewards), the samples trained into it and the minutes since the
version before; and how long feedback waited until a version trained on it served."""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate

from claw_stream.evaluation.held_out import HeldOutPoint, held_out_curve
from claw_stream.evaluation.report.replayed import ReplayRow, ReplaySection, replay_section

T_MIN = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class VersionRow:
    """A row of `weight_versions`: `trainer_step` is the last step its weights hold."""

    version: int
    status: str
    trainer_step: int | None
    ready_at: datetime | None  # a rollback to it: when it was served again
    rolled_back_from: int | None = None
    reason: str | None = None  # why it was rolled back to


@dataclass(frozen=True)
class LiveTurn:
    """A main-line turn of the user's agent, answered by `version`, with its judge's vote and
    what the user sent on it."""

    version: int
    prm_score: int | None  # the judge's vote: -1, 0, 1; None: not judged
    feedback: int | None  # the user's thumbs on it
    explicit_reward: float | None  # a reward set on it (`/rl/set_reward` with its step)


@dataclass(frozen=True)
class Feedback:
    """A feedback or reward call on one answer, and the trainer step that took its sample."""

    at: datetime
    trained_in_step: int | None


@dataclass(frozen=True)
class ReportRows:
    policy: str
    scope: str  # what the rows were filtered by, in words
    versions: list[VersionRow]
    trained_per_step: dict[int, int]  # trainer step -> samples it trained
    turns: list[LiveTurn]
    feedback: list[Feedback]
    first_served: dict[int, datetime]  # version -> its first answer
    held_out: list[tuple[str, int, str, float]]  # (source, version, item, score)
    replay: list[ReplayRow] = field(default_factory=list)


@dataclass(frozen=True)
class VersionLine:
    version: int
    status: str
    ready_at: datetime | None
    minutes_since_previous: float | None
    samples_trained: int
    turns: int
    votes: dict[int, int]  # the judge's vote -> turns
    unjudged: int
    feedback_up: int
    feedback_down: int
    rewards: int
    mean_reward: float | None


@dataclass(frozen=True)
class Waits:
    """Seconds from a feedback call to the first answer of a version trained on its turn."""

    seconds: list[float]
    pending: int  # feedback whose sample no served version holds yet

    def percentile(self, p: float) -> float | None:
        if not self.seconds:
            return None
        if len(self.seconds) == 1:
            return self.seconds[0]
        return statistics.quantiles(self.seconds, n=100, method="inclusive")[round(p) - 1]


@dataclass
class LearningReport:
    policy: str
    scope: str
    versions: list[VersionLine]
    held_out: dict[str, list[HeldOutPoint]]  # source -> its curve
    waits: Waits
    notes: list[str] = field(default_factory=list)
    rollbacks: list[tuple[int, int]] = field(default_factory=list)  # (from, to), in order
    replay: ReplaySection = field(default_factory=ReplaySection)


def build(rows: ReportRows) -> LearningReport:
    served = _served_version(rows.versions)
    trained: Counter[int] = Counter()
    for step, n in rows.trained_per_step.items():
        version = served(step)
        if version is not None:
            trained[version] += n
    by_version: dict[int, list[LiveTurn]] = defaultdict(list)
    for turn in rows.turns:
        by_version[turn.version].append(turn)
    known = {v.version: v for v in rows.versions}
    numbers = sorted(set(known) | set(by_version) | {0})
    lines = []
    previous_ready: datetime | None = None
    for number in numbers:
        row = known.get(number)
        ready = row.ready_at if row else None
        lines.append(_line(number, row, by_version[number], trained[number], ready, previous_ready))
        previous_ready = ready or previous_ready
    scores: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for source, version, item, score in rows.held_out:
        scores[source][version][item] = score
    report = LearningReport(
        rows.policy,
        rows.scope,
        lines,
        {source: held_out_curve(by) for source, by in sorted(scores.items())},
        _waits(rows.feedback, served, rows.first_served),
        replay=replay_section(rows.replay),
    )
    report.notes += report.replay.notes
    for v in sorted(rows.versions, key=lambda v: v.ready_at or T_MIN):
        if v.rolled_back_from is not None:
            report.rollbacks.append((v.rolled_back_from, v.version))
            when = f" at {v.ready_at:%H:%M:%S}" if v.ready_at else ""
            report.notes.append(
                f"v{v.version} served again{when}, rolled back from v{v.rolled_back_from}: "
                f"{v.reason or 'no reason given'}"
            )
    if not rows.held_out:
        report.notes.append(
            "no held-out scores yet: `claw-stream demo` and `claw-stream eval` write them"
        )
    return report


def _line(
    number: int,
    row: VersionRow | None,
    turns: Sequence[LiveTurn],
    trained: int,
    ready: datetime | None,
    previous_ready: datetime | None,
) -> VersionLine:
    votes = Counter(t.prm_score for t in turns if t.prm_score is not None)
    rewards = [t.explicit_reward for t in turns if t.explicit_reward is not None]
    since = (ready - previous_ready).total_seconds() / 60 if ready and previous_ready else None
    status = row.status if row else ("base" if number == 0 else "unknown")
    if row and row.rolled_back_from is not None:
        status += f", rolled back to from v{row.rolled_back_from}"
        since = None  # served again: its ready time is the rollback's
    return VersionLine(
        version=number,
        status=status,
        ready_at=ready,
        minutes_since_previous=since,
        samples_trained=trained,
        turns=len(turns),
        votes=dict(votes),
        unjudged=sum(t.prm_score is None for t in turns),
        feedback_up=sum((t.feedback or 0) > 0 for t in turns),
        feedback_down=sum((t.feedback or 0) < 0 for t in turns),
        rewards=len(rewards),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
    )


def _served_version(versions: list[VersionRow]) -> Callable[[int], int | None]:
    """The first version whose weights hold a trainer step (None: none pushed yet); only
    versions that served (not rejected or failed) count."""
    pushed = sorted(
        (v.trainer_step, v.version)
        for v in versions
        if v.trainer_step is not None and v.status not in ("rejected", "failed")
    )

    def served(step: int) -> int | None:
        return next((version for last, version in pushed if last >= step), None)

    return served


def _waits(
    feedback: list[Feedback],
    served: Callable[[int], int | None],
    first_served: dict[int, datetime],
) -> Waits:
    first_answer = _first_answer_from(first_served)
    seconds: list[float] = []
    pending = 0
    for f in feedback:
        version = served(f.trained_in_step) if f.trained_in_step is not None else None
        first = first_answer(version) if version is not None else None
        if first is None:
            pending += 1
        else:
            seconds.append(max(0.0, (first - f.at).total_seconds()))
    return Waits(sorted(seconds), pending)


def _first_answer_from(first_served: dict[int, datetime]) -> Callable[[int], datetime | None]:
    """The first answer of `version` or any later one (a version skipped by serving, or
    rejected, is held by the ones after it): each version's, the earliest of those after it
    taken once, so each feedback's lookup is a bisection."""
    versions = sorted(first_served)
    earliest = list(accumulate(reversed([first_served[v] for v in versions]), min))[::-1]

    def first_answer(version: int) -> datetime | None:
        i = bisect_left(versions, version)
        return earliest[i] if i < len(versions) else None

    return first_answer
