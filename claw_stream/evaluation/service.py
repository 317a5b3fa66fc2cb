"""`claw-stream eval`: play held-out tasks through the gateway as side calls (archived, never
trained) and record the score of each version that answered; `--follow` does it for every
version the trainer announces ready on claw.weights (under serving.policy gated: every candidate,
which it then promotes or rejects, `serving/promoter.py`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.records import EvalMetrics, VersionScore, evaluated_versions, save
from claw_stream.settings import Settings
from claw_stream.tasks.dataset import load_tasks
from claw_stream.tasks.runner import Episode, RunOptions, RunReport, run_tasks


def gateway_url(settings: Settings, base_url: str | None = None) -> str:
    g = settings.gateway
    return (base_url or f"http://{g.host}:{g.port}").rstrip("/").removesuffix("/v1")


def scores_of(
    report: RunReport, run_id: str, policy: str, config: EvalSettings, started: datetime
) -> list[VersionScore]:
    """One row per version that answered (a swap during the run splits it)."""
    finished = datetime.now(UTC)
    by_version: dict[int, list[Episode]] = {}
    for episode in report.episodes:
        by_version.setdefault(episode.version, []).append(episode)
    out = []
    for version, episodes in sorted(by_version.items()):
        scored = [e for e in episodes if e.reward is not None]
        out.append(
            VersionScore(
                run_id=run_id,
                policy=policy,
                version=version,
                dataset=config.dataset,
                agent=config.agent,
                n_tasks=len({e.task_id for e in episodes}),
                n_episodes=len(episodes),
                n_passed=sum(e.passed for e in scored),
                n_failed=len(episodes) - len(scored),
                score=sum(e.passed for e in scored) / len(scored) if scored else 0.0,
                mean_reward=sum(e.reward or 0.0 for e in scored) / len(scored) if scored else 0.0,
                started_at=started,
                finished_at=finished,
            )
        )
    return out


async def evaluate(
    settings: Settings,
    config: EvalSettings,
    base_url: str | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    *,
    direct: bool = False,
) -> list[VersionScore]:
    """One eval run of the served version(s); the rows are saved to `eval_runs`. `direct`:
    base_url is an engine's, played without the gateway (a candidate's evaluation)."""
    tasks = load_tasks(config.dataset, config.limit)
    run_id = f"eval-{uuid.uuid4().hex[:8]}"
    opts = RunOptions(
        agent=config.agent,
        group_size=config.attempts,
        max_turns=config.max_turns,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        concurrency=config.concurrency,
        seed=0 if config.temperature > 0 else None,
        scratch_dir=settings.data_dir / "scratch",
        run_id=run_id,
        train=False,
        direct=direct,
    )
    started = datetime.now(UTC)
    report = await run_tasks(
        gateway_url(settings, base_url), settings.resolved_admin_key(), tasks, opts, on_episode
    )
    scores = scores_of(report, run_id, settings.policy_name, config, started)
    await save(settings.database_url, scores)
    return scores


async def follow(
    settings: Settings,
    config: EvalSettings,
    metrics: EvalMetrics,
    base_url: str | None = None,
    on_scores: Callable[[list[VersionScore]], None] | None = None,
) -> None:
    """Evaluate the served version now, then each version announced ready, once each. Gated:
    decide each candidate instead (the promoter scores the serving version when it needs to,
    on the candidate engine, so no gateway is needed)."""
    from claw_stream.bus.kafka import make_consumer
    from claw_stream.events import EventError, WeightEvent, decode_event
    from claw_stream.serving import promoter

    gated = settings.serving.policy == "gated"

    done = await evaluated_versions(settings.database_url, settings.policy_name, config.dataset)
    full = len(load_tasks(config.dataset, config.limit)) * config.attempts

    async def run() -> None:
        # a swap during a run scores the new version on part of the set: run again, once, so
        # the version now served gets a whole run
        for _ in range(2):
            scores = await evaluate(settings, config, base_url)
            for s in scores:
                metrics.observe(s)
                if s.n_episodes == full:
                    done.add(s.version)
            if on_scores is not None:
                on_scores(scores)
            if scores and scores[-1].n_episodes == full:
                return

    def observe(score: VersionScore) -> None:
        metrics.observe(score)
        if on_scores is not None:
            on_scores([score])

    consumer = make_consumer(
        settings.kafka_bootstrap, settings.topics.weights, group_id=f"claw-eval-{uuid.uuid4().hex}"
    )
    await consumer.start()
    try:
        if not gated:
            await run()
        async for message in consumer:
            try:
                event = decode_event(WeightEvent, message.value)
            except EventError:
                continue
            if event.policy != settings.policy_name:
                continue
            if gated:  # the promoter scores candidates, and with them what it serves
                if event.status == "candidate":
                    await promoter.decide(settings, config, event, on_score=observe)
                continue
            ready = event.status == "ready"
            if ready and event.version > max(done, default=-1):  # older ones are not served
                await run()
    finally:
        await consumer.stop()
