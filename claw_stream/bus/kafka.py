"""aiokafka clients configured the way every claw-stream process uses them.

Tansu (the embedded broker) fails InitProducerId, so producers are never idempotent or
transactional: delivery is at-least-once and every consumer dedupes by event id.

No claw-stream client ever lets the broker create a topic. aiokafka asks for
`allow_auto_topic_creation` in every metadata request, and Tansu then creates an unknown topic
with its own default of 4 partitions: a gateway that reconnected to a broker restarted empty,
before `topics apply`, got a `claw.steps` of 4 partitions where the spec says 6, which the
apply then only reports, and sends to the missing partitions failed for good (measured: 249 of
250 answered calls never reached the topic). Topics come from `topics/*.yaml` only, through
`apply_topics` (which the gateway's `TopicGuard` calls itself when one is missing).

No group member's commit outlives its membership. aiokafka retries a commit that failed with a
retriable error (UnknownTopicOrPartition among them) until it lands, under whatever generation
the consumer has by then. When the embedded broker restarted empty under a live worker, the
worker's last commit kept failing until `topics apply` recreated the topics, then landed as a
"simple" commit (generation -1) in the new broker's empty group: offsets 26 and 49 from the old
log, on partitions of the new log that held fewer records. The worker's next assignment started
there and skipped every record before (measured: 64 to 75 of 325 to 384 answered Steps never
archived). A commit of a consumer whose partitions the group assigns is now refused once that
consumer is no longer a member of the generation whose assignment it commits for; the worker
rejoins, finds no committed offsets on the new broker and reads its new log from the start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiokafka.admin.client
import aiokafka.client
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import CommitFailedError, KafkaError, UnknownError
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import RecordMetadata

from claw_stream.events import Event, encode_event

log = logging.getLogger(__name__)


class _NeverAutoCreate(MetadataRequest):
    def __init__(
        self, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None
    ):
        super().__init__(topics, allow_auto_topic_creation=False)


# every client and admin client in the process (Faust's included) builds its metadata
# requests from these names
aiokafka.client.MetadataRequest = _NeverAutoCreate
aiokafka.admin.client.MetadataRequest = _NeverAutoCreate

_send_commit = GroupCoordinator._do_commit_offsets


async def _commit_within_membership(self: Any, assignment: Any, offsets: Any) -> None:
    if self._subscription.partitions_auto_assigned() and (
        self.generation < 0 or not assignment.active
    ):
        raise CommitFailedError(
            "not committed: the consumer left the group generation these offsets were read in "
            "(the broker restarted or the group rebalanced); the new assignment starts from the "
            "group's committed offsets"
        )
    await _send_commit(self, assignment, offsets)


GroupCoordinator._do_commit_offsets = _commit_within_membership


def make_producer(bootstrap: str, **overrides: Any) -> AIOKafkaProducer:
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "enable_idempotence": False,
        "linger_ms": 2,
        "max_request_size": 16 * 1024 * 1024,
        # Steps and samples are tens of KB: with the default 16 KB every record would travel
        # in a batch of its own, and a busy gateway would pay a produce request per record
        "max_batch_size": 1024 * 1024,
        "compression_type": None,
    }
    options.update(overrides)
    return AIOKafkaProducer(**options)


def make_consumer(bootstrap: str, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_bytes": 64 * 1024 * 1024,
        "max_partition_fetch_bytes": 16 * 1024 * 1024,
        # Tansu does not end a long poll when data arrives: keep the wait short
        "fetch_max_wait_ms": 100,
    }
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


# Tansu takes a produce to a topic that does not exist (from a producer whose metadata outlived
# a broker restarted empty) and keeps the records; creating the topic afterwards resets each
# partition's high watermark to 0 while those records stay, and every produce to the partition
# then fails with UnknownError, once per early record, while the watermark climbs past them
# (measured: 20 early records, 20 failures, then offsets 20, 21, ...). A gateway that retried its
# spool's head once per backoff drained nothing for 76 s behind 228 early records. Such a failed
# produce wrote nothing (its record is written last), so it is sent again at once.
RESET_RETRY_S = 30.0


async def send_past_reset(
    producer: AIOKafkaProducer,
    topic: str,
    value: bytes,
    key: bytes,
    timeout_s: float | None = None,
) -> RecordMetadata:
    """`send_and_wait` (each try bounded by `timeout_s`, if given) that sends again at once
    while the broker answers UnknownError, for up to RESET_RETRY_S."""
    deadline = time.monotonic() + RESET_RETRY_S
    failures = 0
    while True:
        try:
            sending = producer.send_and_wait(topic, value, key=key)
            meta = await (sending if timeout_s is None else asyncio.wait_for(sending, timeout_s))
        except UnknownError:
            failures += 1
            if time.monotonic() > deadline:
                raise
            continue
        if failures:
            log.warning(
                "%s[%d] answered UnknownError %d time(s) before offset %d (a partition re-created "
                "after it took records)",
                topic,
                meta.partition,
                failures,
                meta.offset,
            )
        return meta


async def send_all_past_reset(
    producer: AIOKafkaProducer, topic: str, records: list[tuple[bytes, bytes]]
) -> None:
    """Send every (key, value) at once and wait for all their acks; those the broker answered
    with UnknownError (which wrote nothing, see RESET_RETRY_S) are sent again one by one, in
    their order, as `send_past_reset` does."""
    sent = [await producer.send(topic, value, key=key) for key, value in records]
    results = await asyncio.gather(*sent, return_exceptions=True)
    for (key, value), result in zip(records, results, strict=True):
        if isinstance(result, UnknownError):
            await send_past_reset(producer, topic, value, key)
        elif isinstance(result, BaseException):
            raise result


async def publish(producer: AIOKafkaProducer, topic: str, key: str, event: Event) -> None:
    """Send one event and wait until the broker acknowledged it (acks=all)."""
    await send_past_reset(producer, topic, encode_event(event), key.encode())


async def read_to_end(
    consumer: AIOKafkaConsumer, starts: dict[TopicPartition, int], stall_polls: int = 5
) -> AsyncIterator[ConsumerRecord]:
    """Records of each partition from its start offset to its end (and whatever arrives while
    reading). End offsets are only a lower bound: Tansu answers ListOffsets with less than the
    true end when the last batch holds several records (measured: 2437 for 2461), so reading
    goes on past them until a poll comes back empty.

    The other way round too: a Tansu restarted empty takes records for a topic not yet
    created, lists them once it is, and serves nothing from that partition for a while
    (measured: 1 to 12 s and more). Reading gives up after `stall_polls` empty polls short of
    the end: the caller takes what it did not see as absent (and sends it again, which costs a
    duplicate that every consumer drops by event id)."""
    parts = list(starts)
    consumer.assign(parts)
    ends = await consumer.end_offsets(parts)
    for tp, offset in starts.items():
        consumer.seek(tp, offset)
    caught_up = all(starts[tp] >= ends[tp] for tp in parts)  # then one short poll for the rest
    stalled = 0
    while True:
        batch = await consumer.getmany(timeout_ms=300 if caught_up else 1000)
        if not batch and caught_up:
            return
        stalled = 0 if batch else stalled + 1
        if stalled >= stall_polls:
            log.warning("%s: the broker lists records it does not serve; read what it did", parts)
            return
        for records in batch.values():
            for record in records:
                yield record
        if not caught_up:
            positions = [await consumer.position(tp) for tp in parts]
            caught_up = all(p >= ends[tp] for p, tp in zip(positions, parts, strict=True))


async def partitions_of(consumer: AIOKafkaConsumer, *topics: str) -> list[TopicPartition]:
    await consumer.topics()  # load the cluster metadata, so partitions are known
    return [
        TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or [])
    ]


async def wait_for_broker(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Return once the broker answers metadata requests; raise TimeoutError otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Exception | None = None
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # connection refused is expected while the broker starts
    try:
        while loop.time() < deadline:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2_000)
            try:
                await admin.start()
                await admin.list_topics()
                return
            except (KafkaError, OSError) as exc:
                last = exc
            finally:
                await admin.close()
            await asyncio.sleep(0.2)
    finally:
        quiet.setLevel(level)
    raise TimeoutError(f"Kafka broker at {bootstrap} not reachable after {timeout_s:.0f}s: {last}")
