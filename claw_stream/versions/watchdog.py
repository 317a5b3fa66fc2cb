"""The rollback watchdog of `serving.policy: latest`: every version the trainer publishes is
served at once, so a bad run of training reaches users; after each version's held-out
evaluation, the watchdog compares the last K versions with the best recent one, item by item
(`Watchdog`, pure), and rolls back to it when each of them lost (`watch`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.held_out import against, held_out_curve
from claw_stream.evaluation.held_out_records import scores_by_version
from claw_stream.evaluation.records import EvalMetrics
from claw_stream.settings import Settings
from claw_stream.versions import ServingError
from claw_stream.versions.config import WatchdogSettings
from claw_stream.versions.rollback import rollback

log = logging.getLogger(__name__)


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


async def watch(
    settings: Settings, config: EvalSettings, dog: Watchdog, full: int, metrics: EvalMetrics
) -> None:
    """The watchdog on the versions evaluated whole; a rollback it finds is done through the
    same code as `claw-stream rollback`, its finding the reason announced with it."""
    policy = settings.policy_name
    scores = await scores_by_version(settings.database_url, policy, f"tasks:{config.dataset}")
    finding = dog.check({v: s for v, s in scores.items() if len(s) >= full})
    log.info("watchdog: %s", finding.reason)
    if finding.rollback_to is None:
        return
    try:
        done = await rollback(settings, finding.rollback_to, f"watchdog: {finding.reason}")
    except ServingError as exc:  # its checkpoint pruned (trainer.keep_checkpoints), an engine down
        log.warning("watchdog could not roll back to v%d: %s", finding.rollback_to, exc)
        return
    dog.rolled_back(done.version, done.previous)
    metrics.rollbacks.labels(policy=policy).inc()
    log.warning(
        "watchdog rolled %s back from v%d to v%d: %s",
        policy,
        done.previous,
        done.version,
        finding.reason,
    )
