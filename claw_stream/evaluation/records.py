"""Eval runs in Postgres (table `eval_runs`, view `eval_scores`) and Prometheus gauges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import select

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

    def observe(self, s: VersionScore) -> None:
        labels = {"policy": s.policy, "dataset": s.dataset}
        self.score.labels(**labels).set(s.score)
        self.reward.labels(**labels).set(s.mean_reward)
        self.version.labels(**labels).set(s.version)
        self.runs.labels(**labels).inc()
