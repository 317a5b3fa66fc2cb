"""What a demo saw: the persona's live answers and the held-out sets, per version, and the
held-out curve with its intervals."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from claw_stream.evaluation.held_out import HeldOutPoint, against, held_out_curve, verdict
from claw_stream.evaluation.held_out_records import ItemScore
from claw_stream.evaluation.intervals import wilson


@dataclass(frozen=True)
class LiveAnswer:
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
    liked: bool  # by the persona's rule: its pass


def mean_words(answers: Sequence[HeldOutAnswer]) -> float:
    """The mean length of a held-out set's answers, in words."""
    return sum(a.words for a in answers) / len(answers)


@dataclass
class Tally:
    answers: list[LiveAnswer] = field(default_factory=list)
    # complete held-out sets (one answer per question), by the version that gave them
    held_out: dict[int, list[HeldOutAnswer]] = field(default_factory=dict)
    # the same, asked with the user's skills in the prompt
    held_out_skills: dict[int, list[HeldOutAnswer]] = field(default_factory=dict)
    held_out_session: str | None = None  # the session the held-out calls were filed under

    def per_version(self) -> list[tuple[int, int, float, float]]:
        """(version, answers, share short, mean reward), by version."""
        by: dict[int, list[LiveAnswer]] = defaultdict(list)
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
        """Each scored version on the held-out set, against the first one (v0 in a demo) and
        the one before; an answer the persona likes passes."""
        return held_out_curve(
            {
                v: {str(a.question): float(a.liked) for a in answers}
                for v, answers in self.held_out.items()
            }
        )

    def verdict(self, passes: str = "short answers") -> str:
        """Whether the last version scored beats the first beyond the interval, in one line."""
        return verdict(self.held_out_curve(), "held-out questions", passes)

    def skills_verdict(self, passes: str = "short answers") -> str:
        """Whether the newest version asked with skills beats the first asked without, beyond
        the interval, in one line."""
        if not self.held_out or not self.held_out_skills:
            return "the held-out set was not asked both without and with skills"
        first, last = min(self.held_out), max(self.held_out_skills)
        w = against(
            {str(a.question): float(a.liked) for a in self.held_out_skills[last]},
            {str(a.question): float(a.liked) for a in self.held_out[first]},
        )
        before = wilson(sum(a.liked for a in self.held_out[first]), len(self.held_out[first]))
        after = wilson(
            sum(a.liked for a in self.held_out_skills[last]), len(self.held_out_skills[last])
        )
        how = "beats" if w.beats else "does not beat"
        return (
            f"v{last} with skills {how} v{first} without beyond the interval: win rate "
            f"{w.value:.0%} [{w.low:.0%}, {w.high:.0%}] on {w.wins + w.ties + w.losses} "
            f"held-out questions ({w.wins} won, {w.ties} tied, {w.losses} lost); {passes} "
            f"{before.value:.0%} -> {after.value:.0%}"
        )

    def item_scores(self) -> list[ItemScore]:
        """The held-out sets as `held_out_results` rows: source `persona`, and `persona+skills`
        for the sets asked with the user's skills (the report draws each source's curve); an
        answer the persona likes 1."""
        return [
            ItemScore(source, v, f"q{a.question:02d}", float(a.liked), self.held_out_session)
            for source, sets in (
                ("persona", self.held_out),
                ("persona+skills", self.held_out_skills),
            )
            for v, answers in sets.items()
            for a in answers
        ]
