"""A version announced: recorded in weight_versions (so whoever reads Postgres sees the decision
without waiting for a worker), then published on claw.weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from claw_stream.bus.kafka import make_producer, publish
from claw_stream.events import WeightEvent
from claw_stream.store.db import make_engine
from claw_stream.versions.records import record

if TYPE_CHECKING:
    from claw_stream.settings import Settings


async def announce(settings: Settings, event: WeightEvent) -> None:
    """Record the event in weight_versions, then publish it."""
    engine = make_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await record(conn, event)
    finally:
        await engine.dispose()
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        await publish(producer, settings.topics.weights, event.policy, event)
    finally:
        await producer.stop()
