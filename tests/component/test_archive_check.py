"""The archive check against the real broker, its worker down: it looks whether each journal
entry is still at its offset without reading the topic once per entry, and every entry the
broker lost in a restart is sent again and lands once."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from pathlib import Path

import pytest

from claw_stream.bus.kafka import make_consumer, partitions_of, read_to_end
from claw_stream.gateway.delivery.archive_check import ArchiveCheck, ArchiveTable
from claw_stream.gateway.delivery.publisher import EventPublisher

from ..fixtures.broker import Broker

STEPS = "claw.steps"
N = 300
PADDING = "x" * 16_000  # a Step of the bench's size (~18 KB)


def step(step_id: str) -> bytes:
    return f'{{"step_id":"{step_id}","padding":"{PADDING}"}}'.encode()


async def on_topic(bootstrap: str) -> Counter[str]:
    """How often each Step id is on the topic."""
    consumer = make_consumer(bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        seen: Counter[str] = Counter()
        starts = dict.fromkeys(await partitions_of(consumer, STEPS), 0)
        async for message in read_to_end(consumer, starts):
            seen[message.value[len(b'{"step_id":"') :][:36].decode()] += 1
        return seen
    finally:
        await consumer.stop()


async def test_a_worker_down_costs_the_broker_a_read_per_fetch_not_per_step_and_lost_steps_return(
    restartable_broker: Broker, tmp_path: Path
) -> None:
    broker = restartable_broker
    publisher = EventPublisher(
        broker.bootstrap, tmp_path / "spool", confirm_topics=frozenset({STEPS})
    )
    await publisher.start()
    check = ArchiveCheck(
        publisher,
        lambda: None,  # Postgres away: the archive says nothing, as while the worker is down
        {STEPS: ArchiveTable("steps", "step_id")},
        "no-such-worker",
        confirm_after_s=0.0,
        resend_after_s=0.0,
    )
    fetches = 0
    records = check._records

    async def counted(*args):  # type: ignore[no-untyped-def]
        nonlocal fetches
        fetches += 1
        return await records(*args)

    check._records = counted  # type: ignore[method-assign]
    try:
        ids = [str(uuid.uuid4()) for _ in range(N)]
        sent = await asyncio.gather(
            *(
                publisher.publish_encoded(STEPS, f"session-{i % 40}", step(s), "step_id", s)
                for i, s in enumerate(ids)
            )
        )
        assert all(sent), "the broker acknowledged every Step"

        await check.check_once()
        entries = publisher.unarchived.entries  # type: ignore[union-attr]
        assert check.figures.resent == 0, "every Step is still at its offset"
        assert all(e.checks == 1 for e in entries.values()), "each was looked at once"
        # ~5.4 MB of Steps over the topic's partitions, read 1 MB at a time: not 300 fetches
        assert fetches <= 30, f"{fetches} fetches to look at {N} Steps"

        broker.kill()  # restarted empty, as the supervisor restarts the embedded broker
        await asyncio.to_thread(broker.start)
        for entry in entries.values():
            entry.next_query = entry.next_check = 0.0
        await check.check_once()
        assert check.figures.resent == N, "every Step the broker lost is sent again"
        async with asyncio.timeout(60):
            while len(publisher.spool):
                await publisher.drain()
        seen = await on_topic(broker.bootstrap)
        assert {s: seen[s] for s in ids} == dict.fromkeys(ids, 1), "each lands once"
    finally:
        await publisher.stop()


async def test_steps_a_worker_consumed_without_archiving_are_forgotten_and_no_traceback_logged(
    restartable_broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The check reads the worker group's committed offsets for the partitions it looks at:
    what the worker consumed and did not archive (it dead-lettered it) leaves the journal, and
    asking costs no traceback (asked for all of a group's partitions, the embedded broker
    answers a body aiokafka cannot decode: it logged "Unexpected exception in
    AIOKafkaConnection", dropped the connection, and the check found nothing committed)."""
    broker = restartable_broker
    publisher = EventPublisher(
        broker.bootstrap, tmp_path / "spool", confirm_topics=frozenset({STEPS})
    )
    await publisher.start()
    group = f"worker-{uuid.uuid4().hex[:6]}"
    check = ArchiveCheck(
        publisher,
        lambda: None,
        {STEPS: ArchiveTable("steps", "step_id")},
        group,
        confirm_after_s=0.0,
        resend_after_s=0.0,
    )
    try:
        ids = [str(uuid.uuid4()) for _ in range(20)]
        for i, s in enumerate(ids):
            assert await publisher.publish_encoded(STEPS, f"session-{i % 5}", step(s), "step_id", s)
        entries = publisher.unarchived.entries  # type: ignore[union-attr]
        await check.check_once()  # the group consumed nothing yet: the worker is behind
        assert (len(entries), check.figures.handled_unarchived) == (len(ids), 0)

        # the worker's group consumes every Step and commits, archiving none
        consumer = make_consumer(broker.bootstrap, STEPS, group_id=group)
        await consumer.start()
        try:
            seen = 0
            async with asyncio.timeout(60):
                while seen < len(ids):
                    batch = await consumer.getmany(timeout_ms=1_000)
                    seen += sum(len(records) for records in batch.values())
            await consumer.commit()
        finally:
            await consumer.stop()
        for entry in entries.values():
            entry.next_query = entry.next_check = 0.0
        caplog.clear()
        await check.check_once()
        assert check.figures.handled_unarchived == len(ids) and not entries
        assert check.figures.resent == 0
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, [r.getMessage() for r in errors]
    finally:
        await publisher.stop()
