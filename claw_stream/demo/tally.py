"""What a demo saw: the persona's live answers and the held-out sets, per version, and the
held-out curve with its intervals."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from claw_stream.evaluation.intervals import Share, WinRate, wilson, win_rate


@dataclass(frozen=True)
class Answer:
    version: int
    words: int
    short: bool
    reward: float


@dataclass(frozen=True)
class HeldOutAnswer:
    question: int  # its index in the held-out set
    version: int
    words: int
    short: bool


@dataclass(frozen=True)
class HeldOutPoint:
    """One version on the held-out set: its share of short answers, and its win rate against
    the first version scored (None for that one)."""

    version: int
    short: Share
    against_first: WinRate | None


@dataclass
class Tally:
    answers: list[Answer] = field(default_factory=list)
    # complete held-out sets (one answer per question), by the version that gave them
    held_out: dict[int, list[HeldOutAnswer]] = field(default_factory=dict)

    def per_version(self) -> list[tuple[int, int, float, float]]:
        """(version, answers, share short, mean reward), by version."""
        by: dict[int, list[Answer]] = defaultdict(list)
        for a in self.answers:
            by[a.version].append(a)
        return [
            (
                v,
                len(xs),
                sum(a.short for a in xs) / len(xs),
                sum(a.reward for a in xs) / len(xs),
            )
            for v, xs in sorted(by.items())
        ]

    def held_out_curve(self) -> list[HeldOutPoint]:
        """Each scored version on the held-out set, against the first one (v0 in a demo)."""
        if not self.held_out:
            return []
        first = self.held_out[min(self.held_out)]
        points = []
        for version, answers in sorted(self.held_out.items()):
            short = [float(a.short) for a in answers]
            points.append(
                HeldOutPoint(
                    version,
                    wilson(sum(a.short for a in answers), len(answers)),
                    None if answers is first else win_rate(short, [float(a.short) for a in first]),
                )
            )
        return points

    def verdict(self) -> str:
        """Whether the last version scored beats the first beyond the interval, in one line."""
        curve = self.held_out_curve()
        if len(curve) < 2:
            return "only one version answered the held-out questions: nothing to compare"
        first, last = curve[0], curve[-1]
        assert last.against_first is not None
        w = last.against_first
        how = "beats" if w.beats else "does not beat"
        return (
            f"v{last.version} {how} v{first.version} beyond the interval: win rate "
            f"{w.value:.0%} [{w.low:.0%}, {w.high:.0%}] on {first.short.n} held-out questions "
            f"({w.wins} won, {w.ties} tied, {w.losses} lost); short answers "
            f"{first.short.value:.0%} -> {last.short.value:.0%}"
        )
