"""The rollback watchdog of `serving.policy: latest` (pure): every version the trainer publishes
is served at once, so a bad run of training reaches users; after each version's held-out
evaluation, the watchdog compares the last K versions with the best recent one, item by item,
and rolls back to it when each of them lost."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from claw_stream.evaluation.held_out import against, held_out_curve
from claw_stream.serving.config import WatchdogSettings


@dataclass(frozen=True)
class Finding:
    rollback_to: int | None  # None: nothing to do
    reason: str


@dataclass
class Watchdog:
    config: WatchdogSettings
    # versions a rollback left behind: never the best again, never counted as recent
    superseded: set[int] = field(default_factory=set)

    def check(self, scores: Mapping[int, Mapping[str, float]]) -> Finding:
        """`scores`: version -> held-out item -> score, for whole evaluations only."""
        k = self.config.patience
        versions = sorted(v for v in scores if v not in self.superseded)
        if len(versions) < k + 1:
            return Finding(None, f"{len(versions)} versions evaluated: fewer than {k} + 1")
        recent, pool = versions[-k:], versions[:-k][-self.config.window :]
        shares = {p.version: p.passed.value for p in held_out_curve({v: scores[v] for v in pool})}
        best = max(pool, key=lambda v: (shares[v], v))  # the newest of the best
        floor = 0.5 - self.config.margin
        rates = [(v, against(scores[v], scores[best])) for v in recent]
        said = ", ".join(f"v{v} {r.value:.0%} [{r.low:.0%}, {r.high:.0%}]" for v, r in rates)
        if all(r.value < floor for _, r in rates):
            return Finding(
                best,
                f"held-out win rate against v{best} below {floor:.0%} for {k} consecutive "
                f"version{'s' if k > 1 else ''}: {said}; rolled back to v{best}",
            )
        return Finding(None, f"against v{best}: {said} (rolls back below {floor:.0%})")

    def rolled_back(self, to: int, served: int) -> None:
        """After a rollback from `served` to `to`: the versions in between are left behind."""
        self.superseded |= set(range(to + 1, served + 1))
