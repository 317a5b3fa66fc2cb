"""The gateway's publisher against the real broker: a lone event goes as its own produce
request, concurrent ones through the producer's batches; either way one session's events
land once each, in the order they were published."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from claw_stream.bus.kafka import make_consumer, partitions_of, read_to_end
from claw_stream.gateway.publisher import EventPublisher

TOPIC = "claw.steps"


async def test_one_sessions_events_land_once_each_in_publish_order(
    broker: str, tmp_path: Path
) -> None:
    key = f"publisher-{uuid.uuid4().hex}"
    publisher = EventPublisher(broker, tmp_path / "spool")
    await publisher.start()
    try:
        values = [f'{{"n":{i},"key":"{key}"}}'.encode() for i in range(60)]
        sent = [
            await publisher.publish_encoded(TOPIC, key, v, "n", str(i))
            for i, v in enumerate(values[:10])  # one at a time: each goes alone
        ]
        sent += await asyncio.gather(  # together: the first alone, the rest batched behind it
            *(
                publisher.publish_encoded(TOPIC, key, v, "n", str(i))
                for i, v in enumerate(values[10:], 10)
            )
        )
        assert publisher._alone == set()
    finally:
        await publisher.stop()
    assert all(sent)  # acknowledged by the broker, nothing spooled

    consumer = make_consumer(broker, group_id=None)
    await consumer.start()
    try:
        parts = await partitions_of(consumer, TOPIC)
        landed = [
            m.value
            async for m in read_to_end(consumer, dict.fromkeys(parts, 0))
            if m.key == key.encode()
        ]
    finally:
        await consumer.stop()
    assert landed == values
