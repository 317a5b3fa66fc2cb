"""`claw-stream worker`: the Faust app whose agents run the pipeline.

    stitch    claw.steps + claw.session-events -> claw.turns     (one agent: per-session order)
    judge     claw.turns -> claw.judgements                      (concurrent, capped)
    assemble  claw.judgements -> claw.samples                    (through the Postgres outbox)
    weights   claw.weights -> releases held samples
    sweeper   a timer on every worker: idle sessions, late closes, held and orphaned samples

Workers started with the same app id share the partitions. Records are values only
(`raw`): each handler decodes with the event contract and sends what it cannot use to the DLQ.
"""

from __future__ import annotations

import logging
from typing import Any

import faust

from claw_stream.processors.pipeline import Pipeline
from claw_stream.settings import Settings

log = logging.getLogger(__name__)


def broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def create_app(settings: Settings, pipeline: Pipeline | None = None) -> faust.App:
    c = settings.worker
    datadir = settings.data_dir / "worker" / c.app_id
    datadir.mkdir(parents=True, exist_ok=True)
    pipeline = pipeline or Pipeline(
        c, settings.kafka_bootstrap, settings.database_url, settings.policy_name
    )
    app = faust.App(
        c.app_id,
        broker=broker_urls(settings.kafka_bootstrap),
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        topic_allow_declare=False,  # topics come from `topics apply` (topics/*.yaml)
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_commit_interval=1.0,
        # a SIGKILLed worker's partitions move to the others within seconds, not minutes
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=20.0,
        broker_max_poll_interval=1800.0,  # a judged batch may take long on CPU
        stream_buffer_maxsize=256,
        datadir=str(datadir),
    )
    app.conf.pipeline = pipeline  # type: ignore[attr-defined]

    async def run(processor: str, stream: Any) -> None:
        await pipeline.start()
        async for event in stream.events():
            message = event.message
            await pipeline.handle(
                processor,
                message.topic,
                message.value,
                partition=message.partition,
                offset=message.offset,
                key=message.key,
            )

    @app.agent(app.topic(c.steps_topic, c.events_topic), name="stitch")
    async def stitch(stream: Any) -> None:
        await run("stitch", stream)

    @app.agent(app.topic(c.turns_topic), name="judge", concurrency=c.turn_concurrency)
    async def judge(stream: Any) -> None:
        await run("judge", stream)

    @app.agent(app.topic(c.judgements_topic), name="assemble")
    async def assemble(stream: Any) -> None:
        await run("assemble", stream)

    @app.agent(app.topic(c.weights_topic), name="weights")
    async def weights(stream: Any) -> None:
        await run("weights", stream)

    @app.timer(interval=c.sweep_interval_s)
    async def sweeper() -> None:
        await pipeline.start()
        try:
            await pipeline.sweep()
        except Exception:
            log.exception("sweep failed; it runs again in %.1fs", c.sweep_interval_s)

    @app.on_before_shutdown.connect
    async def _stop(app: faust.App, **kwargs: Any) -> None:
        await pipeline.stop()

    return app
