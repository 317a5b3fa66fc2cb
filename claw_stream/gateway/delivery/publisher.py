"""Publishes events with acks=all; when the broker cannot take them, spools them durably.

Order is kept: once anything is spooled, new events queue behind it until the spool drained.
A send that timed out may still reach the broker later: aiokafka keeps the batch, and a request
written while the broker was stopped waits whole in the broker's socket buffer, even when the
process that wrote it was killed since. So before re-sending spooled records the drainer waits
for every send still under way, gives the broker a moment after it answers again, and skips
the records already on the topic — every answered call's event lands exactly once.

Every event goes to its partition's leader as a produce request of its own, on the producer's
connection: the producer's accumulator and sender task would add a third to the wait of a
client whose answer waits for the ack, and its sender retries a batch whose connection closed
while the first write may still land (Tansu has no idempotent producer to drop the copy). With
batches for concurrent events, 4 of 10 runs of the broker-pause test beside a CPU-burning
process put a Step on the topic twice; with a request each, 0 of 10. Only while the producer's
metadata does not know a partition's leader does an event go through the producer. A broker
handles a connection's requests in order, so one session's events land in publish order
(`tests/component/test_gateway_publisher.py` sends 50 at once).

The spool drains whatever the error was: each failure is logged (a line every
`SPOOL_LOG_EVERY_S` while records wait, with how many, how old and why), the topics are checked
against their specs (`TopicGuard`: a missing one is created, a wrong one is never written to),
the metadata refreshed, and after `RENEW_AFTER_FAILURES` failures in a row the producer
replaced. Events of `confirm_topics` are also kept in the `Unarchived` journal until the
worker's archive has them (see `archive_check.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, for_code
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from claw_stream.bus.guard import TopicGuard
from claw_stream.bus.kafka import (
    make_consumer,
    make_producer,
    partitions_of,
    read_to_end,
    send_past_reset,
)
from claw_stream.events import Event, encode_event
from claw_stream.gateway.background import Background
from claw_stream.gateway.delivery.spool import Spool, SpooledRecord, SpoolSlot, release_lock
from claw_stream.gateway.delivery.unarchived import Unarchived

log = logging.getLogger(__name__)
SCAN_BACK = 10_000  # records per partition searched for duplicates when no offset is known
LATE_SEND_GRACE_S = 1.0  # after the broker answers again, for requests it had not read yet
SPOOL_LOG_EVERY_S = 10.0
# what a drain meets while the broker is away, restarting or refusing: no traceback for these
BROKER_AWAY = (KafkaError, TimeoutError, OSError)
RENEW_AFTER_FAILURES = 3
# A record whose send has no known outcome, by id: the offsets acknowledged before it was sent,
# per partition. If it landed, it landed after them (empty: nothing known, search SCAN_BACK).
Uncertain = dict[str, dict[TopicPartition, int]]


class EventPublisher:
    def __init__(
        self,
        bootstrap: str,
        spool_dir: Path,
        *,
        timeout_s: float = 5.0,
        on_publish: Callable[[float], None] | None = None,
        guard: TopicGuard | None = None,
        confirm_topics: frozenset[str] = frozenset(),
    ):
        self.bootstrap = bootstrap
        self.guard = guard
        self.confirm_topics = confirm_topics
        self.timeout_s = timeout_s
        self.slot = SpoolSlot(spool_dir)  # one per process of the gateway
        self.spool = Spool(self.slot.directory)
        self.unarchived = Unarchived(self.slot.directory) if confirm_topics else None
        self.last_error: str | None = None  # why the spool does not drain, while it does not
        self._producer: AIOKafkaProducer | None = None
        self._uncertain: Uncertain = _all_ids(self.spool)  # sent before the restart? unknown
        self._orphans = True  # slots of earlier processes may hold records: look at start
        self._acked: dict[TopicPartition, int] = {}  # last acknowledged offset per partition
        self._drainer = Background()
        self._wake = asyncio.Event()
        self._drain_lock = asyncio.Lock()
        self._on_publish = on_publish
        self._alone: set[asyncio.Task[tuple[TopicPartition, int]]] = set()
        self._partitioner = DefaultPartitioner()  # the producer's own: same key, same partition

    async def start(self) -> None:
        with contextlib.suppress(KafkaError, OSError, TimeoutError):
            if self.guard is not None:
                await self.guard.check(force=True)
            await self._ensure_producer()
        self._drainer.start(self._drain_forever())

    async def stop(self) -> None:
        await self._drainer.stop()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.stop(), 5)
        if self.unarchived is not None:
            self.unarchived.close()
        self.slot.release()

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = make_producer(
                self.bootstrap,
                request_timeout_ms=int(self.timeout_s * 1000),
                retry_backoff_ms=100,
                linger_ms=0,  # a client waits on every ack: send at once
            )
            try:
                async with asyncio.timeout(self.timeout_s * 2):
                    await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def publish(self, topic: str, key: str, event: Event) -> bool:
        """Durably record `event`: True when the broker acknowledged it, False when spooled."""
        return await self.publish_encoded(
            topic, key, encode_event(event), event.id_field, str(event.id)
        )

    async def publish_encoded(
        self, topic: str, key: str, value: bytes, id_field: str, record_id: str
    ) -> bool:
        """`publish` for an event already encoded (the gateway's Steps)."""
        record = SpooledRecord(topic, key.encode(), value, id_field, record_id)
        if self.unarchived is not None and topic in self.confirm_topics:
            self.unarchived.add(record)
        if len(self.spool) == 0 and not (self.guard and self.guard.is_wrong(topic)):
            started = time.perf_counter()
            acked_before = self._acked.copy()
            try:
                producer = await self._ensure_producer()
                async with asyncio.timeout(self.timeout_s):  # wait_for would add a task
                    if sending := self._send_alone(producer, record):
                        tp, offset = await asyncio.shield(sending)
                    else:
                        meta = await producer.send_and_wait(topic, record.value, key=record.key)
                        tp, offset = TopicPartition(meta.topic, meta.partition), meta.offset
            except (KafkaError, OSError, TimeoutError) as exc:
                log.warning(
                    "broker unavailable (%s); spooling %s %s",
                    type(exc).__name__,
                    topic,
                    record.record_id,
                )
                self._uncertain[record.record_id] = acked_before
            else:
                self._placed(record.record_id, tp, offset)
                if self._on_publish:
                    self._on_publish(time.perf_counter() - started)
                return True
        await asyncio.to_thread(self.spool.append, record)
        self._wake.set()
        return False

    def _placed(self, record_id: str, tp: TopicPartition, offset: int) -> None:
        self._acked[tp] = offset
        if self.unarchived is not None:
            self.unarchived.placed(record_id, tp.partition, offset)

    async def resend(self, record: SpooledRecord) -> None:
        """Send again, behind whatever waits, an event the broker acknowledged and then lost."""
        await asyncio.to_thread(self.spool.append, replace(record, at=0.0))
        self._wake.set()

    def spooled_ids(self) -> set[str]:
        return {r.record_id for r in self.spool.head(len(self.spool))}

    def _send_alone(
        self, producer: AIOKafkaProducer, record: SpooledRecord
    ) -> asyncio.Task[tuple[TopicPartition, int]] | None:
        """Send `record` as a produce request of its own (acks=all); None while the producer's
        metadata does not know its partition's leader (the producer then finds it)."""
        cluster = producer.client.cluster
        partitions = cluster.partitions_for_topic(record.topic)
        if not partitions:
            return None
        partition = self._partitioner(
            record.key, list(partitions), list(cluster.available_partitions_for_topic(record.topic))
        )
        tp = TopicPartition(record.topic, partition)
        leader = cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            return None
        batch = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=len(record.value) + len(record.key) + 1024,
        )
        batch.append(0, int(time.time() * 1000), record.key, record.value, [])
        request = ProduceRequest(
            transactional_id=None,
            required_acks=-1,
            timeout=int(self.timeout_s * 1000),
            topics=[(record.topic, [(partition, bytes(batch.build()))])],
        )
        task = asyncio.create_task(self._produce(producer, leader, tp, request))
        self._alone.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[tuple[TopicPartition, int]]) -> None:
        self._alone.discard(task)
        if not task.cancelled():
            task.exception()  # a send its publisher gave up on (timed out) failed: known

    @staticmethod
    async def _produce(
        producer: AIOKafkaProducer, leader: int, tp: TopicPartition, request: ProduceRequest
    ) -> tuple[TopicPartition, int]:
        response = await producer.client.send(leader, request)
        for _topic, partitions in response.topics:
            for answer in partitions:
                partition, error, offset = answer[:3]
                if partition == tp.partition:
                    if error:
                        raise for_code(error)()
                    return tp, offset
        raise KafkaError(f"the broker's produce response does not mention {tp}")

    async def _settle(self, producer: AIOKafkaProducer) -> None:
        """Wait until every send under way has been acknowledged or has failed."""
        await asyncio.wait_for(producer.flush(), self.timeout_s * 4)
        if self._alone:
            await asyncio.wait(set(self._alone), timeout=self.timeout_s * 4)

    async def drain(self) -> int:
        """Publish spooled records in order, orphaned slots first; how many left a spool."""
        async with self._drain_lock:  # one drainer at a time, or the head is sent twice
            done = 0
            if self._orphans:
                for directory, fd in self.slot.orphans():
                    try:
                        if self.unarchived is not None:
                            self.unarchived.adopt(Unarchived(directory))
                        orphan = Spool(directory)
                        done += await self._drain(orphan, _all_ids(orphan))
                    finally:
                        release_lock(fd)
                self._orphans = False
            return done + await self._drain(self.spool, self._uncertain)

    async def _drain(self, spool: Spool, uncertain: Uncertain) -> int:
        done = 0
        graced = False
        while len(spool):
            producer = await self._ensure_producer()
            batch = spool.head(100)
            wrong = self.guard.wrong if self.guard is not None else {}
            if blocked := sorted({r.topic for r in batch if r.topic in wrong}):
                raise KafkaError(f"topic {blocked[0]} differs from its spec: {wrong[blocked[0]]}")
            skip: set[str] = set()
            if any(r.record_id in uncertain for r in batch):
                await self._settle(producer)
                if not graced:
                    # the broker answers: what waited in its socket buffers lands now
                    await asyncio.wait_for(producer.client.fetch_all_metadata(), self.timeout_s)
                    await asyncio.sleep(LATE_SEND_GRACE_S)
                    graced = True
                # aiokafka waits for a partition's position without a deadline: a broker that
                # answered garbage while restarting (seen: a 2-byte array length) hung the
                # drain of a restarted gateway for good, its spool never emptied
                async with asyncio.timeout(self.timeout_s * 6):
                    skip = await self._already_on_topic(batch, uncertain)
            for record in batch:
                if record.record_id not in skip:
                    # sent but not yet out of the spool: a retry after a failure must check
                    # the topic before sending it again
                    uncertain.setdefault(record.record_id, self._acked.copy())
                    meta = await send_past_reset(
                        producer, record.topic, record.value, record.key, self.timeout_s
                    )
                    tp = TopicPartition(meta.topic, meta.partition)
                    self._placed(record.record_id, tp, meta.offset)
            await asyncio.to_thread(spool.pop, len(batch))
            for record in batch:
                uncertain.pop(record.record_id, None)
            done += len(batch)
        return done

    async def _already_on_topic(self, batch: list[SpooledRecord], uncertain: Uncertain) -> set[str]:
        """Ids of `batch` that an earlier, timed-out send delivered after all."""
        wanted = {r.record_id: r.marker() for r in batch if r.record_id in uncertain}
        topics = {r.topic for r in batch}
        consumer = make_consumer(self.bootstrap, enable_auto_commit=False, group_id=None)
        await consumer.start()
        found: set[str] = set()
        try:
            partitions = await partitions_of(consumer, *topics)
            if not partitions:
                return found
            ends = await consumer.end_offsets(partitions)
            # from the oldest acknowledgement any of them was sent after: not from the latest
            # one, which may be of a record that landed after them
            known = [uncertain[record_id] for record_id in wanted]
            starts = {
                tp: max(0, min(k.get(tp, ends[tp] - SCAN_BACK - 1) for k in known) + 1)
                for tp in partitions
            }
            async for message in read_to_end(consumer, starts):
                for record_id, marker in wanted.items():
                    if marker in message.value:
                        found.add(record_id)
        finally:
            await consumer.stop()
        return found

    async def _drain_forever(self) -> None:
        delay = 0.2
        failures = 0
        logged = 0.0
        while True:
            if not len(self.spool) and not self._orphans:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                continue
            try:
                drained = await self.drain()
                if drained:
                    log.info("drained %d spooled record(s)", drained)
                delay, failures, self.last_error = 0.2, 0, None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any error: the spool must drain once it clears
                failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if time.monotonic() - logged >= SPOOL_LOG_EVERY_S:
                    logged = time.monotonic()
                    oldest = self.spool.oldest_at()
                    log.warning(
                        "%d record(s) wait in the spool (oldest %.0f s): %s",
                        len(self.spool),
                        time.time() - oldest if oldest else 0.0,
                        self.last_error,
                        # where it failed, once per streak; the broker away or refusing (a
                        # topic that differs from its spec) is said in the line itself
                        exc_info=failures == 1 and not isinstance(exc, BROKER_AWAY),
                    )
                await self._recover(failures)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _recover(self, failures: int) -> None:
        """After a failed drain: check the topics, refresh the metadata, renew the producer."""
        try:
            if self.guard is not None:
                await self.guard.check()
            if self._producer is not None:
                if failures >= RENEW_AFTER_FAILURES:
                    producer, self._producer = self._producer, None
                    await asyncio.wait_for(producer.stop(), self.timeout_s)
                else:
                    await asyncio.wait_for(
                        self._producer.client.force_metadata_update(), self.timeout_s
                    )
        except Exception as exc:  # the broker is still away: the next round tries again
            log.debug("spool recovery: %r", exc)


def _all_ids(spool: Spool) -> Uncertain:
    return {r.record_id: {} for r in spool.head(len(spool))}
