"""From judgements and session signals to a sample's reward, and the release rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from claw_stream.events import Judgement
from claw_stream.names import DEFAULT_PRECEDENCE, SESSION_SIGNALS


@dataclass(frozen=True)
class Signals:
    explicit: float | None = None  # /rl/set_reward aimed at this step
    feedback: int | None = None  # thumbs -1 / 0 / 1 aimed at this step
    episode: float | None = None  # the session's reward, discounted back to this turn
    prm: int | None = None  # the PRM majority
    sources: Mapping[str, float] = field(default_factory=dict)  # other reward sources, by name

    def get(self, name: str) -> float | None:
        if name in SESSION_SIGNALS or (name == "prm" and self.prm is not None):
            value: float | None = getattr(self, name)
            return value
        return self.sources.get(name)


def source_scores(judgement: Judgement) -> dict[str, float]:
    """The scores a judgement's reward sources gave (those that failed are left out)."""
    return {r.source: r.score for r in judgement.rewards if r.score is not None}


def step_reward(
    signals: Signals,
    precedence: Sequence[str] = DEFAULT_PRECEDENCE,
    rule: Literal["override", "join"] = "override",
) -> tuple[float, str]:
    """override: the first signal present in the order of precedence; join: the mean of all
    present signals, reported under the first of them."""
    present = [(s, v) for s in precedence if (v := signals.get(s)) is not None]
    if not present:
        return 0.0, "none"
    if rule == "join":
        return sum(float(v) for _, v in present) / len(present), present[0][0]
    source, value = present[0]
    return float(value), source


def discounted(episode_reward: float, n_turns: int, gamma: float) -> list[float]:
    """An end-of-episode reward carried back over the turns: turn k gets gamma^(n-1-k) * R."""
    return [episode_reward * gamma ** (n_turns - 1 - k) for k in range(n_turns)]


def has_signal(method: str, reward: float, has_teacher: bool) -> bool:
    """Whether a sample can teach anything: binary needs a reward, opd a teacher, combine either."""
    if method == "binary":
        return reward != 0.0
    if method == "opd":
        return has_teacher
    return reward != 0.0 or has_teacher


def is_stale(sample_version: int, serving_version: int, max_staleness: int) -> bool:
    """Versions between the sample's and the serving one, either way: after a rollback to v3 a
    sample of v8 is as far from what is served (and trained from) as one of v-2 would be."""
    return abs(serving_version - sample_version) > max_staleness
