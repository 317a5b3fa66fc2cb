"""`claw-stream eval --follow`: the served version is evaluated now, then each version the trainer
announces ready on claw.weights, once each; under serving.policy gated every candidate is decided
instead (`promotion.py`); under latest, the watchdog rolls back when new versions do worse on the
held-out tasks (`watchdog.py`). Above both evaluation and promotion, so neither imports the
other."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from claw_stream.bus.kafka import make_consumer
from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.records import EvalMetrics, VersionScore, evaluated_versions
from claw_stream.evaluation.replay.pairs import by_version_and_scorer
from claw_stream.evaluation.replay.service import ReplayError, replay
from claw_stream.evaluation.service import evaluate, gateway_url
from claw_stream.events import EventError, WeightEvent, decode_event
from claw_stream.settings import Settings
from claw_stream.tasks.dataset import load_tasks
from claw_stream.versions import promotion
from claw_stream.versions.watchdog import Watchdog, watch

log = logging.getLogger(__name__)


async def evaluate_each(
    settings: Settings,
    config: EvalSettings,
    metrics: EvalMetrics,
    base_url: str | None = None,
    on_scores: Callable[[list[VersionScore]], None] | None = None,
) -> None:
    """Evaluate the served version now, then each version announced ready, once each. Gated:
    decide each candidate instead (promotion scores the serving version when it needs to, on
    the candidate engine, so no gateway is needed)."""
    gated = settings.serving.policy == "gated"
    watching = settings.serving.watchdog.enabled and not gated
    dog = Watchdog(settings.serving.watchdog)

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

    async def replayed() -> None:
        if config.replay:
            await replay_served(settings, config, metrics, base_url)

    consumer = make_consumer(
        settings.kafka_bootstrap, settings.topics.weights, group_id=f"claw-eval-{uuid.uuid4().hex}"
    )
    await consumer.start()
    try:
        if not gated:
            await run()
            await replayed()
        async for message in consumer:
            try:
                event = decode_event(WeightEvent, message.value)
            except EventError:
                continue
            ours = event.policy == settings.policy_name
            if gated:  # promotion scores candidates, and with them what it serves
                # the policy's and its tenants' (another stack's on the same broker: not ours)
                if event.status == "candidate" and (
                    ours or settings.tenants.has_adapter(event.policy)
                ):
                    await promotion.decide(settings, config, event, on_score=observe)
                continue
            if not ours:
                continue
            ready = event.status == "ready"
            if ready and event.version > max(done, default=-1):  # older ones are not served
                await run()
                await replayed()
                if watching:
                    await watch(settings, config, dog, full, metrics)
    finally:
        await consumer.stop()


async def replay_served(
    settings: Settings, config: EvalSettings, metrics: EvalMetrics, base_url: str | None
) -> None:
    """The held-out turns asked again of the version served now; a judge or gateway that
    fails is logged, and the next version is replayed as usual."""
    try:
        done = await replay(settings, config, gateway_url(settings, base_url))
    except ReplayError as exc:
        log.warning("replay of the held-out turns failed: %s", exc)
        return
    if done.held_out and not done.scores:
        log.warning("replay: %d held-out turns asked, none scored", done.held_out)
    for (version, scorer), got in by_version_and_scorer(done.scores).items():
        metrics.observe_replay(settings.policy_name, version, scorer, got)
        log.info("replay: v%d on %d held-out turns, scored by %s", version, len(got), scorer)
