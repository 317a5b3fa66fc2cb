"""`claw-stream eval`: play held-out tasks through the gateway as side calls (archived, never
trained) and record the score of each version that answered; `--follow` does it for every
version the trainer announces ready (`versions/evaluate_each.py`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.held_out_records import ItemScore, save_item_scores
from claw_stream.evaluation.records import VersionScore, save
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
    policy: str | None = None,
    model: str | None = None,
    as_version: int | None = None,
) -> list[VersionScore]:
    """One eval run of the served version(s); the rows are saved to `eval_runs`. `direct`:
    base_url is an engine's, played without the gateway (a candidate's evaluation); `model`
    asks that model (an adapter, `policy@vN`), its scores kept under `policy` (a tenant's) and,
    with `as_version`, that version (a tenant's v0: what serves it before its first adapter, the
    shared policy's version)."""
    policy = policy or settings.policy_name
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
        model=model,
    )
    started = datetime.now(UTC)
    report = await run_tasks(
        gateway_url(settings, base_url), settings.resolved_admin_key(), tasks, opts, on_episode
    )
    if as_version is not None:
        report.episodes = [replace(e, version=as_version) for e in report.episodes]
    scores = scores_of(report, run_id, policy, config, started)
    await save(settings.database_url, scores)
    await save_item_scores(settings.database_url, policy, item_scores(report, config))
    return scores


def item_scores(report: RunReport, config: EvalSettings) -> list[ItemScore]:
    """Each scored episode as a held-out item (its task and attempt): 1 passed, 0 not."""
    return [
        ItemScore(
            f"tasks:{config.dataset}",
            e.version,
            f"{e.task_id}#{e.attempt}",
            float(e.passed),
            e.session_id,
        )
        for e in report.episodes
        if e.reward is not None
    ]
