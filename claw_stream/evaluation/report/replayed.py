"""The report's replay part: per version, the held-out turns of real conversations answered
again, against the answers the users got; and how far the judge can be trusted, measured on
the pairs a rule scored too. Pure."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from claw_stream.evaluation.intervals import WinRate, win_rate
from claw_stream.evaluation.replay.pairs import (
    Agreement,
    agreement,
    by_version_and_scorer,
    unreliable_note,
)


@dataclass(frozen=True)
class ReplayRow:
    """A row of `replay_results`."""

    version: int
    scorer: str
    score: float
    rule_score: float | None
    judge_score: float | None
    judge: str | None


@dataclass(frozen=True)
class ReplayLine:
    version: int
    scorer: str
    against_users: WinRate  # the new answers against the ones the users got
    reliable: bool | None  # a judge's: its agreement with a rule; None: not measured or a rule


@dataclass
class ReplaySection:
    lines: list[ReplayLine] = field(default_factory=list)
    agreements: list[Agreement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def replay_section(rows: list[ReplayRow]) -> ReplaySection:
    pairs: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    for r in rows:
        if r.judge is not None and r.rule_score is not None:  # the judge asked beside a rule
            pairs[r.judge].append((r.rule_score, r.judge_score))
    found = {judge: agreement(judge, both) for judge, both in sorted(pairs.items())}
    section = ReplaySection(agreements=list(found.values()))
    unmeasured: set[str] = set()
    for (version, scorer), got in by_version_and_scorer(rows).items():
        judge = scorer.removeprefix("judge:") if scorer.startswith("judge:") else None
        measured = found.get(judge) if judge else None
        if judge and measured is None:
            unmeasured.add(judge)
        section.lines.append(
            ReplayLine(
                version,
                scorer,
                win_rate(got, [0.5] * len(got)),
                measured.reliable if measured else None,
            )
        )
    for a in section.agreements:
        section.notes.append(
            unreliable_note(a) if not a.reliable else f"the replay's judge is usable: {a.words()}"
        )
    for judge in sorted(unmeasured):
        section.notes.append(
            f"how far the judge {judge} agrees with a rule is not measured yet (`claw-stream "
            "demo` measures it on the persona's rule): read its replay win rates with care"
        )
    return section
