"""A held-out curve: each version's scores on the same items (the demo's questions, an eval's
tasks), its pass share and its win rate against the first version and the one before, both with
their 95% intervals. Pure: the demo's tally and `claw-stream report` feed it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from claw_stream.evaluation.intervals import Share, WinRate, wilson, win_rate


@dataclass(frozen=True)
class HeldOutPoint:
    """One version on the held-out items: how many passed (a score of 1), and its win rate
    against the first version scored and against the one scored before it (None for the first;
    on the items both answered)."""

    version: int
    passed: Share
    against_first: WinRate | None
    against_previous: WinRate | None


def held_out_curve(scores: Mapping[int, Mapping[str, float]]) -> list[HeldOutPoint]:
    """`scores`: version -> item -> score (higher is better, 1 a pass)."""
    versions = sorted(scores)
    points = []
    for i, version in enumerate(versions):
        mine = scores[version]
        points.append(
            HeldOutPoint(
                version,
                wilson(sum(s >= 1.0 for s in mine.values()), len(mine)),
                against(mine, scores[versions[0]]) if i else None,
                against(mine, scores[versions[i - 1]]) if i else None,
            )
        )
    return points


def verdict(
    curve: list[HeldOutPoint], items: str = "held-out items", passes: str = "passed"
) -> str:
    """Whether the last version beats the first beyond the interval, in one line."""
    if len(curve) < 2:
        return f"only one version answered the {items}: nothing to compare"
    # the newest version scored on the whole set: a version that came in the middle of an
    # evaluation is scored on part of it, and would be compared on a few items only
    whole = max(p.passed.n for p in curve[1:])
    first, last = curve[0], [p for p in curve[1:] if p.passed.n == whole][-1]
    assert last.against_first is not None
    w = last.against_first
    how = "beats" if w.beats else "does not beat"
    return (
        f"v{last.version} {how} v{first.version} beyond the interval: win rate "
        f"{w.value:.0%} [{w.low:.0%}, {w.high:.0%}] on {w.wins + w.ties + w.losses} {items} "
        f"({w.wins} won, {w.ties} tied, {w.losses} lost); {passes} "
        f"{first.passed.value:.0%} -> {last.passed.value:.0%}"
    )


def against(new: Mapping[str, float], base: Mapping[str, float]) -> WinRate:
    """The win rate of `new` over `base` on the items both answered."""
    both = sorted(new.keys() & base.keys())
    return win_rate([new[k] for k in both], [base[k] for k in both])
