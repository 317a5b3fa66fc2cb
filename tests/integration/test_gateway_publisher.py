"""The gateway's publisher against the real broker: a lone event goes as its own produce
request, concurrent ones through the producer's batches; either way one session's events
land once each, in the order they were published."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from claw_stream.bus.kafka import (
    make_consumer,
    make_producer,
    partitions_of,
    read_to_end,
    wait_for_broker,
)
from claw_stream.bus.topics import apply_topics, load_specs
from claw_stream.embedded.broker import broker_command
from claw_stream.gateway.publisher import EventPublisher
from claw_stream.gateway.spool import SpooledRecord

from ..support.processes import free_port

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


async def test_a_partition_that_took_records_before_its_topic_was_created_drains_at_once(
    tmp_path: Path,
) -> None:
    """The broker restarts empty; a producer whose metadata outlived it sends records to
    `claw.steps` before the topics are applied, and Tansu keeps them; once the topic is created,
    that partition answers UnknownError once per early record. The spool behind it drains in
    seconds (each failed send is repeated at once), not one try per backoff, and every record
    lands once."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(broker_command("127.0.0.1", port), stdout=subprocess.DEVNULL)
        asyncio.run(wait_for_broker(bootstrap))
        return proc

    broker = await asyncio.to_thread(start)
    key = f"reset-{uuid.uuid4().hex}"
    early = 40
    try:
        await apply_topics(bootstrap)
        producer = make_producer(bootstrap, request_timeout_ms=5000, linger_ms=0)
        await producer.start()
        try:
            await producer.send_and_wait(TOPIC, b"before", key=key.encode())
            broker.kill()
            broker.wait()
            broker = await asyncio.to_thread(start)  # empty, no topics
            for i in range(early):
                await producer.send_and_wait(TOPIC, f"early {i}".encode(), key=key.encode())
        finally:
            await producer.stop()
        await apply_topics(bootstrap)
        publisher = EventPublisher(bootstrap, tmp_path / "spool", timeout_s=2.0)
        values = [f'{{"event_id":"{i}","key":"{key}"}}'.encode() for i in range(5)]
        for i, value in enumerate(values):  # what waited in the gateway's spool
            publisher.spool.append(SpooledRecord(TOPIC, key.encode(), value, "event_id", str(i)))
        started = time.monotonic()
        await publisher.start()
        try:
            while len(publisher.spool):
                # without the repeat: 40 failures at the drain's backoff (0.2 s doubling to 5 s)
                # take over two minutes
                assert time.monotonic() - started < 30, f"spool still holds {len(publisher.spool)}"
                await asyncio.sleep(0.1)
        finally:
            await publisher.stop()
        on_topic = await landed(bootstrap, key)
        assert on_topic[-len(values) :] == values
        assert on_topic.count(values[0]) == 1
    finally:
        broker.kill()
        broker.wait()
