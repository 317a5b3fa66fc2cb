"""The gateway's publisher against the real broker: a lone event goes as its own produce
request, concurrent ones through the producer's batches; either way one session's events
land once each, in the order they were published."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from claw_stream.bus.kafka import make_consumer, partitions_of, read_to_end
from claw_stream.bus.topics import apply_topics, load_specs
from claw_stream.gateway.publisher import EventPublisher
from claw_stream.gateway.spool import SpooledRecord

TOPIC = "claw.steps"


async def test_one_sessions_events_land_once_each_in_publish_order(
    broker: str, tmp_path: Path
) -> None:
    key = f"publisher-{uuid.uuid4().hex}"
    topic = f"claw.test-publisher-{uuid.uuid4().hex[:8]}"  # other tests read claw.steps as Steps
    (steps,) = [s for s in load_specs() if s.name == TOPIC]
    await apply_topics(broker, [steps.model_copy(update={"name": topic})])
    publisher = EventPublisher(broker, tmp_path / "spool")
    await publisher.start()
    try:
        values = [f'{{"n":{i},"key":"{key}"}}'.encode() for i in range(60)]
        sent = [
            await publisher.publish_encoded(topic, key, v, "n", str(i))
            for i, v in enumerate(values[:10])  # one at a time: each goes alone
        ]
        sent += await asyncio.gather(  # together: the first alone, the rest batched behind it
            *(
                publisher.publish_encoded(topic, key, v, "n", str(i))
                for i, v in enumerate(values[10:], 10)
            )
        )
    finally:
        await publisher.stop()
    assert all(sent)  # acknowledged by the broker, nothing spooled

    assert await landed(broker, key, topic) == values


async def landed(bootstrap: str, key: str, topic: str = TOPIC) -> list[bytes]:
    consumer = make_consumer(bootstrap, group_id=None)
    await consumer.start()
    try:
        parts = await partitions_of(consumer, topic)
        return [
            m.value
            async for m in read_to_end(consumer, dict.fromkeys(parts, 0))
            if m.key == key.encode()
        ]
    finally:
        await consumer.stop()


async def test_a_drain_broken_off_part_way_sends_nothing_twice(
    own_broker, tmp_path: Path, monkeypatch
) -> None:
    """The broker stops while the spool drains: the records it acknowledged before, and the one
    it took while stopped, are found on the topic when the drain starts again, not re-sent."""
    bootstrap, broker = own_broker
    key = f"drain-{uuid.uuid4().hex}"
    publisher = EventPublisher(bootstrap, tmp_path / "spool", timeout_s=1.0)
    values = [f'{{"event_id":"{i}","key":"{key}"}}'.encode() for i in range(12)]
    for i, value in enumerate(values):  # what a process left in its spool
        publisher.spool.append(SpooledRecord(TOPIC, key.encode(), value, "event_id", str(i)))
    sends = 0
    broken_off: list[BaseException] = []
    send_and_wait = AIOKafkaProducer.send_and_wait

    async def stopping_at_the_fifth(producer: AIOKafkaProducer, *args, **kwargs):
        nonlocal sends
        sends += 1
        if sends == 5:
            broker.send_signal(signal.SIGSTOP)
            asyncio.get_running_loop().call_later(3.0, broker.send_signal, signal.SIGCONT)
        try:
            return await send_and_wait(producer, *args, **kwargs)
        except BaseException as exc:  # the drain's timeout cancels the send
            broken_off.append(exc)
            raise

    monkeypatch.setattr(AIOKafkaProducer, "send_and_wait", stopping_at_the_fifth)
    await publisher.start()
    try:
        deadline = time.monotonic() + 60
        while len(publisher.spool):
            assert time.monotonic() < deadline, "the spool did not drain"
            await asyncio.sleep(0.1)
    finally:
        await publisher.stop()
    assert broken_off, "the drain should have broken off at the fifth record"
    assert await landed(bootstrap, key) == values
