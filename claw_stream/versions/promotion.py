"""Gated promotion (`claw-stream eval --follow` under serving.policy gated): each candidate is
evaluated on a candidate engine and compared with the serving version on the same dataset; it is
then served (pushed to the serving engines, announced ready) or rejected (announced rejected,
both scores in the error). Both scores land in eval_runs. The verdict itself (`judge`,
`judge_replay`, `both`) is pure.

A candidate adapter (the shared policy's `policy@vN` under trainer.lora, a tenant's
`tenant@vN`) is asked by its name on the candidate engine, beside the serving adapter (or, where
none was promoted yet, the model the serving engines serve); promoted, it is loaded on the
serving engines, where the gateways find it. Its scores are kept under its policy's name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.records import VersionScore
from claw_stream.evaluation.replay.pairs import won
from claw_stream.evaluation.replay.service import ReplayError, replay
from claw_stream.evaluation.service import evaluate, gateway_url
from claw_stream.events import WeightEvent
from claw_stream.names import adapter_name
from claw_stream.settings import Settings
from claw_stream.store.db import make_engine
from claw_stream.tasks.dataset import load_tasks
from claw_stream.versions import records
from claw_stream.versions.announce import announce
from claw_stream.versions.checkpoints import checkpoint_folder
from claw_stream.versions.push import candidate_engines, load_adapter_once, push, serving_engines
from claw_stream.versions.serving_view import serving_view


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reason: str


def judge(candidate: float, serving: float, margin: float, versions: tuple[int, int]) -> Verdict:
    """Promote a candidate whose score is not below the serving version's by more than margin."""
    new, old = versions
    floor = serving - margin
    promote = candidate >= floor - 1e-9  # scores are ratios of small counts: no float noise
    verb = ">=" if promote else "<"
    return Verdict(
        promote,
        f"v{new} scored {candidate:.4f} {verb} {floor:.4f} "
        f"(serving v{old} scored {serving:.4f}, margin {margin:g})",
    )


def judge_replay(scores: list[float], margin: float, version: int) -> Verdict:
    """The held-out replay as a promotion criterion: the candidate's answers to held-out turns
    against the answers the users got (a win 1, a tie 1/2) must win at least 0.5 - margin."""
    rate = sum(won(s) for s in scores) / len(scores)
    floor = 0.5 - margin
    promote = rate >= floor - 1e-9
    verb = ">=" if promote else "<"
    return Verdict(
        promote,
        f"v{version} won {rate:.0%} {verb} {floor:.0%} of {len(scores)} held-out turns against "
        "the answers the users got",
    )


def both(task: Verdict, replayed: Verdict | None) -> Verdict:
    """Promoted only when every criterion promotes; the reason names each."""
    if replayed is None:
        return task
    return Verdict(task.promote and replayed.promote, f"{task.reason}; {replayed.reason}")


async def _score_on(
    settings: Settings,
    config: EvalSettings,
    url: str,
    version: int,
    folder: Path | None,
    full: int,
    *,
    policy: str,
    adapter: str | None = None,
) -> VersionScore:
    """A whole run of `version` on the engine at url, loading its checkpoint `folder` there
    first (with `rollback`: the trainer may have pushed a newer candidate; an adapter is asked
    by its name); once more when a swap split the run. A tenant's version 0 is whatever the
    engine serves it before it has an adapter (the shared policy's version)."""
    found: VersionScore | None = None
    key = settings.resolved_admin_key()
    for _ in range(2):
        if folder is not None:
            async with httpx.AsyncClient(timeout=600) as http:
                if adapter is None:
                    await push(http, url, folder, version, key, rollback=True)
                else:
                    await load_adapter_once(http, url, folder, version, key, adapter)
        tenant_v0 = version == 0 and policy != settings.policy_name
        scores = await evaluate(
            settings,
            config,
            url,
            direct=True,
            policy=policy,
            model=adapter,
            as_version=0 if tenant_v0 else None,
        )
        found = next((s for s in scores if s.version == version), found)
        if found is not None and found.n_episodes == full:
            break
    if found is None:
        raise RuntimeError(f"{url} answered no request with version {version}")
    return found


async def _replayed(
    settings: Settings,
    config: EvalSettings,
    url: str,
    event: WeightEvent,
    console: Console,
) -> Verdict | None:
    """The held-out turns asked again of the candidate (loaded on the engine at url): None
    when there is none to ask, or the replay failed (the task score decides alone). A
    tenant's candidate is asked its tenant's turns."""
    if not config.replay:
        return None
    version = event.version
    tenant = event.policy if event.policy != settings.policy_name else None
    try:
        done = await replay(
            settings,
            config,
            gateway_url(settings, url),
            direct=True,
            tenant=tenant,
            model=event.adapter_name,
        )
    except ReplayError as exc:
        console.print(f"[yellow]replay of held-out turns failed[/]: {exc}")
        return None
    scores = [p.score for p in done.scores if p.version == version]
    return judge_replay(scores, settings.serving.replay_margin, version) if scores else None


async def decide(
    settings: Settings,
    config: EvalSettings,
    event: WeightEvent,
    on_score: Callable[[VersionScore], None] | None = None,
) -> Verdict | None:
    """Promote or reject one candidate; None when it is decided already or no longer newer
    than the served one."""
    console = Console()
    seen = on_score or (lambda _: None)
    policy = event.policy
    adapter = event.adapter_name  # None: full weights
    full = len(load_tasks(config.dataset, config.limit)) * config.attempts
    db = make_engine(settings.database_url)
    try:
        async with db.connect() as conn:
            view = await serving_view(conn, policy)
            serving_score = await records.whole_score(
                conn, policy, view.serving, config.dataset, full
            )
            open_ = await records.undecided(conn, policy, view.serving)
    finally:
        await db.dispose()
    if event.version not in open_:  # decided already (a replay), or older than the served one
        return None
    candidate_url = candidate_engines(settings)[0]
    folder = Path(event.checkpoint_path or "")
    if serving_score is None:
        serving_adapter = None
        if view.serving_path is None:  # the initial model: scored where it is served
            url, serving_folder = serving_engines(settings)[0], None
        else:  # on the candidate engine, as the candidate is
            url = candidate_url
            serving_folder = checkpoint_folder(settings, view.serving_path, view.serving)
            serving_adapter = adapter_name(policy, view.serving) if adapter else None
        baseline = await _score_on(
            settings,
            config,
            url,
            view.serving,
            serving_folder,
            full,
            policy=policy,
            adapter=serving_adapter,
        )
        seen(baseline)
        serving_score = baseline.score
        console.print(f"serving v{view.serving} scored {serving_score:.4f} on {config.dataset}")
    scored = await _score_on(
        settings, config, candidate_url, event.version, folder, full, policy=policy, adapter=adapter
    )
    seen(scored)
    verdict = both(
        judge(scored.score, serving_score, settings.serving.margin, (event.version, view.serving)),
        await _replayed(settings, config, candidate_url, event, console),
    )
    if verdict.promote:
        key = settings.resolved_admin_key()
        async with httpx.AsyncClient(timeout=600) as http:
            for url in serving_engines(settings):
                if adapter is None:
                    await push(http, url, folder, event.version, key)
                else:
                    await load_adapter_once(http, url, folder, event.version, key, adapter)
    decided = WeightEvent(
        policy=policy,
        version=event.version,
        status="ready" if verdict.promote else "rejected",
        kind=event.kind,
        checkpoint_path=event.checkpoint_path,
        adapter_name=adapter,
        trainer_step=event.trainer_step,
        error=None if verdict.promote else verdict.reason,
    )
    await announce(settings, decided)
    console.print(("promoted " if verdict.promote else "rejected ") + verdict.reason)
    return verdict
