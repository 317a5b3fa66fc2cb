"""From judgements and session signals to a sample's reward, and the release rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["explicit", "feedback", "prm", "episode", "none"]
DEFAULT_PRECEDENCE: tuple[Source, ...] = ("explicit", "feedback", "prm")


@dataclass(frozen=True)
class Signals:
    explicit: float | None = None  # /rl/set_reward aimed at this step
    feedback: int | None = None  # thumbs -1 / 0 / 1 aimed at this step
    prm: int | None = None  # the PRM majority


def step_reward(
    signals: Signals, precedence: tuple[Source, ...] = DEFAULT_PRECEDENCE
) -> tuple[float, Source]:
    """The first signal present in the order of precedence."""
    for source in precedence:
        value = getattr(signals, source, None)
        if value is not None:
            return float(value), source
    return 0.0, "none"


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


def is_stale(sample_version: int, current_version: int, max_staleness: int) -> bool:
    return current_version - sample_version > max_staleness
