"""`topics apply` against the real broker: creates, then no-op; drift reported, nothing changed."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from click.testing import CliRunner

from claw_stream.bus.kafka import make_producer
from claw_stream.bus.topics import TopicSpec, apply_topics, load_specs
from claw_stream.cli import main


async def test_apply_twice_creates_then_is_a_no_op(broker: str) -> None:
    first = await apply_topics(broker)
    second = await apply_topics(broker)
    assert all(r.action in ("created", "ok") for r in first)
    assert [r.action for r in second] == ["ok"] * len(second), second
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        described = {
            d["topic"]: d for d in await admin.describe_topics([s.name for s in load_specs()])
        }
    finally:
        await admin.close()
    for spec in load_specs():
        assert len(described[spec.name]["partitions"]) == spec.partitions


async def test_apply_reports_drift_and_changes_nothing(broker: str) -> None:
    name = f"claw.test-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1, topic_configs={"retention.ms": "1000"})])
        spec = TopicSpec(
            name=name,
            description="drift test",
            partitions=3,
            replication_factor=1,
            retention_ms=-1,
            cleanup_policy="delete",
            key="session_id",
            value="Step",
        )
        (report,) = await apply_topics(broker, [spec])
        assert report.action == "drift"
        assert "partitions 2 (spec 3)" in report.drift
        assert "retention.ms 1000 (spec -1)" in report.drift
        (described,) = await admin.describe_topics([name])
        assert len(described["partitions"]) == 2
    finally:
        await admin.close()


def test_cli_apply_prints_a_table(broker: str) -> None:
    result = CliRunner().invoke(main, ["topics", "apply", "--check", "--kafka-bootstrap", broker])
    assert result.exit_code == 0, result.output
    assert "claw.steps" in result.output and "ok" in result.output


async def test_no_client_makes_the_broker_create_a_topic(broker: str) -> None:
    """Tansu creates an unknown topic a metadata request asks about (with its own partition
    count) unless the request says not to: ours always say not to."""
    name = f"claw.test-missing-{uuid.uuid4().hex[:8]}"
    producer = make_producer(broker, request_timeout_ms=1_500)
    await producer.start()
    try:
        with pytest.raises((KafkaError, TimeoutError)):
            await asyncio.wait_for(producer.send_and_wait(name, b"{}"), 10)
    finally:
        await producer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        assert name not in await admin.list_topics()
    finally:
        await admin.close()
