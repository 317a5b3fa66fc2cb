"""Eval runs in Postgres (table `eval_runs`, view `eval_scores`) and Prometheus gauges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import select

from claw_stream.evaluation.replay.pairs import outcome, won
from claw_stream.store.db import make_engine, make_sessionmaker
from claw_stream.store.models import EvalRun


@dataclass(frozen=True)
class VersionScore:
    """One version's result in one eval run."""

    run_id: str
    policy: str
    version: int
    dataset: str
    agent: str
    n_tasks: int
    n_episodes: int
    n_passed: int
    n_failed: int  # episodes that could not be scored (the gateway refused, ...)
    score: float  # share of scored episodes that passed
    mean_reward: float
    started_at: datetime
    finished_at: datetime


async def save(database_url: str, scores: list[VersionScore]) -> None:
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine).begin() as session:
            session.add_all(EvalRun(**s.__dict__) for s in scores)
    finally:
        await engine.dispose()


async def evaluated_versions(database_url: str, policy: str, dataset: str) -> set[int]:
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(EvalRun.version).where(EvalRun.policy == policy, EvalRun.dataset == dataset)
            )
            return {r[0] for r in rows}
    finally:
        await engine.dispose()


class EvalMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        labels = ["policy", "dataset"]
        self.score = Gauge(
            "claw_eval_score", "Pass rate of the newest evaluated version", labels, registry=r
        )
        self.reward = Gauge(
            "claw_eval_mean_reward",
            "Mean reward of the newest evaluated version",
            labels,
            registry=r,
        )
        self.version = Gauge(
            "claw_eval_version", "The newest evaluated policy version", labels, registry=r
        )
        self.runs = Counter("claw_eval_runs", "Versions evaluated", labels, registry=r)
        self.rollbacks = Counter(
            "claw_eval_rollbacks",
            "Rollbacks by the watchdog (serving.watchdog): newer versions lost on held-out",
            ["policy"],
            registry=r,
        )

        self.replay_win_rate = Gauge(
            "claw_eval_replay_win_rate",
            "The newest replayed version against the answers users got on held-out turns "
            "(a win 1, a tie 1/2)",
            ["policy", "scorer"],
            registry=r,
        )
        self.replay_version = Gauge(
            "claw_eval_replay_version", "The newest replayed version", ["policy"], registry=r
        )
        self.replay_pairs = Counter(
            "claw_eval_replay_pairs",
            "Held-out turns answered again and scored, by outcome of the new answer",
            ["policy", "outcome"],
            registry=r,
        )

    def observe_replay(self, policy: str, version: int, scorer: str, scores: list[float]) -> None:
        """One replay of one version: its pair scores (1 won, 1/2 tie, 0 lost)."""
        if not scores:
            return
        rate = sum(won(s) for s in scores) / len(scores)
        self.replay_win_rate.labels(policy=policy, scorer=scorer).set(rate)
        self.replay_version.labels(policy=policy).set(version)
        for s in scores:
            self.replay_pairs.labels(policy=policy, outcome=outcome(s)).inc()

    def observe(self, s: VersionScore) -> None:
        labels = {"policy": s.policy, "dataset": s.dataset}
        self.score.labels(**labels).set(s.score)
        self.reward.labels(**labels).set(s.mean_reward)
        self.version.labels(**labels).set(s.version)
        self.runs.labels(**labels).inc()
