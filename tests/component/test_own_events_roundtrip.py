"""A turn the worker sent comes back from the real broker byte for byte, and is then taken as
sent, without decoding; a record of the same event written by someone else, or damaged, is
decoded and validated as any other. Real broker (Tansu), real Postgres."""

from __future__ import annotations

import json
import uuid

from aiokafka import TopicPartition

from claw_stream.bus.kafka import make_consumer, make_producer
from claw_stream.bus.topics import apply_topics, specs_for
from claw_stream.names import DEFAULT_TOPICS, Topics
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.worker import Worker

from ..support.factories import make_turn


async def read_all(bootstrap: str, topic: str, n: int) -> list:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        await consumer.topics()
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        records: list = []
        for _ in range(50):
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records += batch
            if len(records) >= n:
                break
        return sorted(records, key=lambda r: r.timestamp)
    finally:
        await consumer.stop()


async def test_own_turns_come_back_as_sent_and_others_are_validated(
    broker: str, database: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(**{role: f"{name}-{tag}" for role, name in DEFAULT_TOPICS.by_role().items()})
    await apply_topics(broker, specs_for(topics))
    worker = Worker(WorkerSettings(), broker, database, topics=topics)
    await worker.start()
    mine, theirs = make_turn(), make_turn()
    try:
        await worker.io.emit(topics.turns, mine.session_id, mine)
        # the same kind of event from another producer: other bytes (indented JSON)
        other = json.dumps(json.loads(theirs.model_dump_json()), indent=1).encode()
        producer = make_producer(broker)
        await producer.start()
        try:
            await producer.send_and_wait(topics.turns, other, key=b"sess-1")
            damaged = other.replace(b'"closed_reason"', b'"closed_reasons"')
            await producer.send_and_wait(topics.turns, damaged, key=b"sess-1")
        finally:
            await producer.stop()
        first, second, third = await read_all(broker, topics.turns, 3)

        decoded = worker.io.decode_all([first, second])
        assert decoded is not None
        assert decoded[0] is mine  # the very object sent: no decode
        assert decoded[1] == theirs and decoded[1] is not theirs  # decoded and validated
        assert worker.io.decode_all([first]) == [mine]  # taken once, then decoded
        assert worker.io.decode_all([third]) is None  # bad input is still refused
        value = worker.io.metrics.registry.get_sample_value
        assert value("claw_worker_own_events_hits") == 1.0
        assert value("claw_worker_own_events_misses") == 3.0  # theirs, mine again, the damaged
    finally:
        await worker.stop()
