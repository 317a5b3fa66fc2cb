"""The worker writes nothing to a topic recreated with the wrong partition count: it notices on
its next periodic check, says so on `claw_worker_topic_wrong`, refuses (a KafkaError its
retries take), and writes again once the topic is fixed. Real broker, real Postgres."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from claw_stream.bus.guard import TopicWrong
from claw_stream.bus.kafka import make_consumer
from claw_stream.bus.topics import apply_topics, specs_for
from claw_stream.names import DEFAULT_TOPICS, Topics
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.worker import Worker

from ..support.factories import make_sample, make_turn


async def recreate(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def records_on(bootstrap: str, topic: str) -> int:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not parts:
            await consumer.topics()  # metadata for the topic
            parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        return sum((await consumer.end_offsets(parts)).values())
    finally:
        await consumer.stop()


def wrong(worker: Worker, topic: str) -> float | None:
    return worker.io.metrics.registry.get_sample_value("claw_worker_topic_wrong", {"topic": topic})


async def test_a_topic_recreated_wrong_is_reported_and_never_written_to(
    broker: str, database: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    # topics of this test's own, so breaking one leaves the session's broker as it was
    topics = Topics(**{role: f"{name}-{tag}" for role, name in DEFAULT_TOPICS.by_role().items()})
    worker = Worker(WorkerSettings(), broker, database, topics=topics)
    worker.io.guard.every_s = 0.5  # 30 s by default; a test cannot wait that long
    await worker.start()
    try:
        await worker.io.emit(topics.turns, "s-1", make_turn())
        assert wrong(worker, topics.turns) == 0.0
        assert await records_on(broker, topics.turns) == 1

        await recreate(broker, topics.turns, 2)  # the spec says 6
        await recreate(broker, topics.samples, 1)
        await asyncio.sleep(0.6)  # the next write is due for a check
        with pytest.raises(TopicWrong, match=r"partitions 2 \(spec 6\)"):
            await worker.io.emit(topics.turns, "s-1", make_turn())
        assert wrong(worker, topics.turns) == 1.0
        assert wrong(worker, topics.samples) == 1.0
        assert wrong(worker, topics.steps) == 0.0
        with pytest.raises(TopicWrong):
            await worker.assembler.publish_samples([make_sample()])
        assert await records_on(broker, topics.turns) == 0
        assert await records_on(broker, topics.samples) == 0

        await recreate(broker, topics.turns, 6)  # what `topics apply` asks the operator for
        await recreate(broker, topics.samples, 6)
        await apply_topics(broker, specs_for(topics))
        await asyncio.sleep(2.1)  # after a refusal the guard checks again at most every 2 s
        await worker.io.emit(topics.turns, "s-1", make_turn())
        assert wrong(worker, topics.turns) == 0.0
        assert wrong(worker, topics.samples) == 0.0
        assert await records_on(broker, topics.turns) == 1
    finally:
        await worker.stop()
