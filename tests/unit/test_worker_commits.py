"""A commit the group refused (after a rebalance or a broker restart) must not crash the
worker's Faust consumer: Faust's own `_commit` decides, on aiokafka's real error. And an offset
read before the last rebalance is never committed after it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

from aiokafka.errors import CommitFailedError
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP
from faust.types.tuples import Message

from claw_stream.settings import Settings
from claw_stream.worker.app import _commit_failures_as_rebalances, _Consumer, create_app

TP0 = TP("claw.steps", 0)


def faust_commit(commit: Any) -> tuple[bool, list[BaseException]]:
    crashes: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    thread = SimpleNamespace(
        _ensure_consumer=lambda: SimpleNamespace(commit=commit),
        assignment=lambda: {TP0},
        tp_last_committed_at={},
        crash=crash,
        log=logging.getLogger("test"),
    )
    done = asyncio.run(faust_kafka.AIOKafkaConsumerThread._commit(thread, {TP0: 10}))  # type: ignore[arg-type]
    return done, crashes


async def refused(offsets: Any) -> None:
    raise CommitFailedError()  # what aiokafka raises for UnknownMemberId and the like


def test_faust_alone_crashes_its_consumer_on_a_refused_commit() -> None:
    """Why the wrapper exists (faust-streaming 0.15.3 with aiokafka 0.14): when this fails,
    Faust recognises aiokafka's error itself and the wrapper can go."""
    done, crashes = faust_commit(refused)
    assert not done
    assert [type(c) for c in crashes] == [CommitFailedError]


def test_a_refused_commit_is_a_rebalance_for_the_worker() -> None:
    assert faust_commit(_commit_failures_as_rebalances(refused)) == (False, [])


def test_a_message_read_before_the_last_rebalance_is_acknowledged_without_its_offset(
    tmp_path: Path,
) -> None:
    """A broker restarted empty numbers its groups' generations from 0 again: a message read
    from the old log, acknowledged after the worker rejoined, looked current and its offset
    was committed to the new group, whose next assignment then started past the new log's
    first records. Each rebalance is a membership of the worker's own, and only what was
    read in the current one moves the committed offsets."""

    async def scenario() -> tuple[list[int], list[int]]:
        app = create_app(Settings(data_dir=tmp_path))
        consumer = app.consumer
        assert isinstance(consumer, _Consumer)
        app.topics.acks_enabled_for = lambda topic: True  # type: ignore[method-assign]
        tp = TP(app.conf.id, 0)
        thread = consumer._thread
        with patch.object(faust_kafka.AIOKafkaConsumerThread, "on_partitions_assigned"):
            await thread.on_partitions_assigned({tp})  # joined the group
        old_log = message(tp, 30, app.consumer_generation_id)
        with (
            patch.object(faust_kafka.AIOKafkaConsumerThread, "on_partitions_revoked"),
            patch.object(faust_kafka.AIOKafkaConsumerThread, "on_partitions_assigned"),
        ):  # the broker restarted empty: revoked, and assigned again in the new group
            await thread.on_partitions_revoked({tp})
            await thread.on_partitions_assigned({tp})
        consumer.ack(old_log)
        after_restart = list(consumer._acked[tp])
        consumer.ack(message(tp, 0, app.consumer_generation_id))
        return after_restart, list(consumer._acked[tp])

    after_restart, now = asyncio.run(scenario())
    assert after_restart == [], "an offset of the old log would be committed to the new group"
    assert now == [0]


def message(tp: TP, offset: int, generation: int) -> Message:
    return Message(
        tp.topic,
        tp.partition,
        offset,
        0.0,
        0,
        None,
        b"k",
        b"v",
        None,
        tp=tp,
        generation_id=generation,
    )
