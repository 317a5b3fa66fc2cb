"""Confidence intervals for held-out scores: a share of passes and a win rate of one version's
answers against another's on the same prompts, both with Wilson's score interval.

A held-out set is small (the demo's is 24 prompts), so a point estimate alone misleads: 40%
against 60% on 24 answers is within noise. The demo's plot draws these bands, and a version
"beats" another only when the whole interval of its win rate lies above one half.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass(frozen=True)
class Share:
    """`k` passes out of `n`, with its 95% interval."""

    k: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else 0.0


def wilson(k: int, n: int, z: float = Z95) -> Share:
    """Wilson's score interval: unlike the normal approximation it stays inside [0, 1] and is
    not empty at 0 or n passes, which small held-out sets often give."""
    if n == 0:
        return Share(0, 0, 0.0, 1.0)
    return Share(k, n, *_wilson_bounds(k / n, n, z))


def _wilson_bounds(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class WinRate:
    """How often `new` did better than `base` on the same prompts: a win counts 1, a tie 1/2."""

    wins: int
    ties: int
    losses: int
    value: float
    low: float
    high: float

    @property
    def beats(self) -> bool:
        """Better beyond the interval: the whole 95% interval lies above one half."""
        return self.low > 0.5


def win_rate(new: Sequence[float], base: Sequence[float]) -> WinRate:
    """The win rate of `new` over `base`, scores of the same prompts in the same order (higher
    is better: a rule's pass as 1 and fail as 0, or a partial credit), with Wilson's interval
    of (wins + ties / 2) out of the prompts. Ties vary less than a coin, so the interval is, if
    anything, too wide; a percentile bootstrap over the prompts was tried and collapsed to
    [100%, 100%] when every prompt was won (24 of 24 in the demo), claiming a certainty that
    24 questions do not give."""
    if len(new) != len(base):
        raise ValueError(f"{len(new)} scores against {len(base)}: not the same prompts")
    wins = sum(a > b for a, b in zip(new, base, strict=True))
    losses = sum(a < b for a, b in zip(new, base, strict=True))
    n = len(new)
    ties = n - wins - losses
    if n == 0:
        return WinRate(0, 0, 0, 0.5, 0.0, 1.0)
    p = (wins + ties / 2) / n
    low, high = _wilson_bounds(p, n)
    return WinRate(wins, ties, losses, p, low, high)
