"""What a worker does with each record, independent of Faust: the agents in `app.py` call it.

Outputs are published before the state that says they were (a crash in between re-emits the
same derived id, which consumers dedupe); samples go through an outbox in Postgres, so a
sample is never lost between "assembled" and "on the topic".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from claw_stream.bus.guard import check_topics
from claw_stream.bus.kafka import (
    make_consumer,
    make_producer,
    partitions_of,
    publish,
    read_to_end,
)
from claw_stream.events import (
    DeadLetter,
    Event,
    EventError,
    Judgement,
    Sample,
    SessionEvent,
    Step,
    Turn,
    WeightEvent,
    decode_event,
    encode_event,
)
from claw_stream.names import Topics
from claw_stream.processors import state
from claw_stream.processors.assemble import assemble_session
from claw_stream.processors.config import PipelineConfig
from claw_stream.processors.judge import JudgeClient, judgement_id_of
from claw_stream.processors.stitch import CloseReason, close_reason, stitch_session
from claw_stream.store.db import make_engine

log = logging.getLogger(__name__)
INFRA_ERRORS = (OperationalError, DBAPIError, KafkaError, OSError, TimeoutError)


@dataclass(frozen=True)
class Record:
    topic: str
    value: bytes | None
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.records = Counter(
            "claw_worker_records", "Records handled by agent", ["agent"], registry=r
        )
        self.dead_letters = Counter(
            "claw_worker_dead_letters", "Records sent to the DLQ", ["agent"], registry=r
        )
        self.turns = Counter("claw_worker_turns", "Turns emitted by reason", ["reason"], registry=r)
        self.samples = Counter(
            "claw_worker_samples",
            "Samples by release status (pending = published, dropped = stale)",
            ["status"],
            registry=r,
        )
        self.judge_seconds = Histogram(
            "claw_worker_judge_seconds", "Time to judge one turn", registry=r
        )
        self.judge_errors = Counter(
            "claw_worker_judge_errors", "Judge requests failed after retries", registry=r
        )


def close_decision(
    view: state.SessionView, now: datetime, config: PipelineConfig
) -> CloseReason | None:
    """Whether a session closes now: ended with every counted step here (or waited long
    enough for missing ones), or idle."""
    if view.end_requested_at is not None:
        complete = view.end_n_steps is None or len(view.steps) >= view.end_n_steps
        waited = (now - view.end_requested_at).total_seconds() >= config.reorder_grace_s
        if complete or waited:
            kind = "refreshed" if view.end_reason == "refreshed" else "ended"
            return close_reason(kind, view.end_reason)
        return None
    if view.last_step_at is None:
        return None
    idle_s = (now - view.last_step_at).total_seconds()
    return "idle_timeout" if idle_s >= config.idle_timeout_s else None


class Pipeline:
    """Clients of one worker process (Postgres, a producer, the judge) and the handlers."""

    def __init__(
        self,
        config: PipelineConfig,
        kafka_bootstrap: str,
        database_url: str,
        policy: str = "policy",
        topics: Topics | None = None,
    ):
        self.config = config
        self.topics = topics or Topics()
        self.bootstrap = kafka_bootstrap
        self.database_url = database_url
        self.policy = policy
        self.metrics = WorkerMetrics()
        self.producer: AIOKafkaProducer | None = None
        self.judge_client: JudgeClient | None = None
        self._started = False
        self._starting: asyncio.Lock | None = None
        self._lost_check_at = 0.0

    async def start(self) -> None:
        """Connect once, in the running loop (Faust's agents and timer each call it)."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if not self._started:
                await self._connect()

    async def _connect(self) -> None:
        self.db = make_engine(
            self.database_url, pool_size=self.config.session_concurrency + 4, max_overflow=4
        )
        await check_topics(self.bootstrap, self.topics)
        self.producer = make_producer(self.bootstrap)
        await self.producer.start()
        self.judge_client = JudgeClient(self.config)
        if self.config.metrics_port is not None:
            start_http_server(
                self.config.metrics_port, self.config.metrics_host, registry=self.metrics.registry
            )
        self._started = True

    async def stop(self) -> None:
        if not self._started:
            return
        if self.producer is not None:
            await self.producer.stop()
        if self.judge_client is not None:
            await self.judge_client.aclose()
        await self.db.dispose()
        self._started = False

    # -- plumbing -----------------------------------------------------------------------------

    async def emit(self, topic: str, key: str, event: Event) -> None:
        assert self.producer is not None
        await publish(self.producer, topic, key, event)

    async def dead_letter(
        self,
        processor: str,
        topic: str,
        value: bytes | None,
        error: BaseException,
        *,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | str | None = None,
    ) -> None:
        raw = value or b""
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode(), "base64"
        key_text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        letter = DeadLetter(
            source_topic=topic,
            partition=partition,
            offset=offset,
            key=key_text,
            value=text,
            value_encoding=encoding,  # type: ignore[arg-type]
            error_type=type(error).__name__,
            error=str(error)[:4000],
            processor=processor,
        )
        self.metrics.dead_letters.labels(processor).inc()
        log.warning("dead letter from %s (%s): %s", processor, topic, letter.error[:300])
        await self.emit(self.topics.dlq, key_text or "", letter)

    async def handle_batch(
        self, processor: str, records: list[Record], by_session: bool = True
    ) -> None:
        """Records of one session one after the other, sessions (or, for independent records,
        each record) concurrently up to `session_concurrency`."""
        groups: dict[Any, list[Record]] = {}
        for i, record in enumerate(records):
            groups.setdefault(record.key if by_session else i, []).append(record)
        slots = asyncio.Semaphore(self.config.session_concurrency)

        async def run(group: list[Record]) -> None:
            async with slots:
                for r in group:
                    await self.handle(
                        processor,
                        r.topic,
                        r.value,
                        partition=r.partition,
                        offset=r.offset,
                        key=r.key,
                    )

        await asyncio.gather(*(run(g) for g in groups.values()))

    async def handle(
        self,
        processor: str,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
    ) -> None:
        """Decode one record and run its handler; bad input and failures go to the DLQ,
        infrastructure errors are retried (the record is not acknowledged meanwhile)."""
        model, handler = self._route(processor, topic)
        self.metrics.records.labels(processor).inc()
        try:
            event = decode_event(model, value or b"")
        except EventError as exc:
            await self.dead_letter(
                processor, topic, value, exc, partition=partition, offset=offset, key=key
            )
            return
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(INFRA_ERRORS),
                wait=wait_exponential(multiplier=0.5, max=10) + wait_random(0, 0.5),
                stop=stop_after_attempt(30),
                reraise=True,
            ):
                with attempt:
                    await handler(event)
        except Exception as exc:
            log.exception("%s failed on %s", processor, topic)
            await self.dead_letter(
                processor, topic, value, exc, partition=partition, offset=offset, key=key
            )

    def _route(self, processor: str, topic: str) -> tuple[type[Event], Any]:
        t = self.topics
        routes: dict[str, tuple[type[Event], Any]] = {
            t.steps: (Step, self.on_step),
            t.session_events: (SessionEvent, self.on_session_event),
            t.turns: (Turn, self.on_turn),
            t.judgements: (Judgement, self.on_judgement),
            t.weights: (WeightEvent, self.on_weight),
        }
        return routes[topic]

    # -- stitch ---------------------------------------------------------------------------------

    async def on_step(self, step: Step) -> None:
        closed: CloseReason | None = None
        async with self.db.begin() as conn:
            await state.lock_session(conn, step.session_id)
            await state.archive_step(conn, step)
            if step.turn_type == "main":
                closed = await self._advance(conn, step.session_id)
        if closed is not None:
            await self.try_assemble(step.session_id)

    async def on_session_event(self, event: SessionEvent) -> None:
        closed: CloseReason | None = None
        async with self.db.begin() as conn:
            await state.lock_session(conn, event.session_id)
            await state.archive_event(conn, event)
            if event.kind in ("ended", "refreshed"):
                closed = await self._advance(conn, event.session_id)
        if closed is not None:
            await self.try_assemble(event.session_id)

    async def advance(self, session_id: str) -> None:
        """Emit the session's new turns; close it when it ended (or idled) completely."""
        async with self.db.begin() as conn:
            await state.lock_session(conn, session_id)
            closed = await self._advance(conn, session_id)
        if closed is not None:
            await self.try_assemble(session_id)

    async def _advance(self, conn: AsyncConnection, session_id: str) -> CloseReason | None:
        """`advance` inside a transaction that holds the session's lock; the close reason when
        the session closed (the caller assembles it once the transaction committed)."""
        view = await state.session_view(conn, session_id)
        if view is None or view.closed_at is not None:
            return None
        now = datetime.now(UTC)
        closed = close_decision(view, now, self.config)
        turns = stitch_session(
            view.steps,
            closed=closed,
            now=now,
            reorder_grace_s=self.config.reorder_grace_s,
            arrived_at=view.arrived_at,
        )
        new = [t for t in turns if t.turn_id not in view.emitted]
        for turn in new:
            await self.emit(self.topics.turns, session_id, turn)
            self.metrics.turns.labels(turn.closed_reason).inc()
        await state.record_turns(conn, new)
        if closed is not None:
            await state.mark_closed(conn, session_id)
        return closed

    # -- judge ----------------------------------------------------------------------------------

    async def on_turn(self, turn: Turn) -> None:
        async with self.db.connect() as conn:
            if await state.judged(conn, judgement_id_of(turn)):
                return  # redelivered: judged already
        assert self.judge_client is not None
        with self.metrics.judge_seconds.time():
            outcome = await self.judge_client.judge(turn)
        if outcome.errors:
            self.metrics.judge_errors.inc(len(outcome.errors))
            error = RuntimeError("; ".join(outcome.errors)[:4000])
            await self.dead_letter(
                "judge", self.topics.turns, encode_event(turn), error, key=turn.session_id
            )
        await self.emit(self.topics.judgements, turn.session_id, outcome.judgement)

    # -- assemble -------------------------------------------------------------------------------

    async def on_judgement(self, judgement: Judgement) -> None:
        async with self.db.begin() as conn:
            await state.archive_judgement(conn, judgement)
        await self.try_assemble(judgement.session_id)

    async def try_assemble(self, session_id: str) -> None:
        c = self.config
        async with self.db.begin() as conn:
            await state.lock_session(conn, session_id)
            inputs = await state.assemble_inputs(conn, session_id)
            if inputs is None:
                return
            judgements, events = inputs
            drafts = assemble_session(judgements, events, c, self.topics.samples)
            gate = await state.gate(conn, self.policy, c.update_timeout_s)
            to_publish, counts = await state.store_samples(
                conn, session_id, drafts, gate, c.max_staleness, self.topics.samples
            )
        for status, n in counts.items():
            self.metrics.samples.labels(status).inc(n)
        await self.publish_samples(to_publish)

    async def publish_samples(self, samples: list[Sample]) -> None:
        for sample in samples:
            await self.emit(self.topics.samples, sample.session_id, sample)
        await state.mark_published(self.db, [s.sample_id for s in samples])

    async def on_weight(self, event: WeightEvent) -> None:
        async with self.db.begin() as conn:
            await state.archive_weight(conn, event)
        if event.status != "updating":
            await self.release()

    async def release(self) -> None:
        c = self.config
        async with self.db.begin() as conn:
            gate = await state.gate(conn, self.policy, c.update_timeout_s)
            samples, dropped = await state.release_held(conn, gate, c.max_staleness)
        if dropped:
            self.metrics.samples.labels("dropped").inc(dropped)
        if samples:
            self.metrics.samples.labels("pending").inc(len(samples))
        await self.publish_samples(samples)

    # -- time -----------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Closes sessions by time, assembles what is ready, releases held samples and resends
        samples a dead worker left pending. Safe on every worker at once."""
        async with self.db.connect() as conn:
            due = await state.sessions_to_sweep(
                conn, self.config.idle_timeout_s, self.config.reorder_grace_s
            )
        for session_id in due:
            await self.advance(session_id)
        async with self.db.connect() as conn:
            ready = await state.sessions_to_assemble(conn)
        for session_id in ready:
            await self.try_assemble(session_id)
        await self.release()
        async with self.db.begin() as conn:
            lost = await state.orphans(conn, self.config.orphan_after_s)
        if lost:
            # a worker died between publishing and marking: send only what is not there yet
            there = await self.on_topic({s.sample_id for s in lost})
            await state.mark_published(self.db, list(there))
            missing = [s for s in lost if s.sample_id not in there]
            log.info(
                "%d samples left pending by a stopped worker: %d resent", len(lost), len(missing)
            )
            await self.publish_samples(missing)
        if time.monotonic() >= self._lost_check_at:
            self._lost_check_at = time.monotonic() + self.config.lost_check_every_s
            await self.resend_lost()

    async def resend_lost(self) -> None:
        """Published samples the trainer has not trained and the samples topic no longer
        holds (the broker restarted without them) are published again; the trainer dedupes
        by sample id what it did train."""
        async with self.db.begin() as conn:
            waiting = await state.untrained(conn, self.config.retrain_after_s)
        if not waiting:
            return
        there = await self.on_topic({s.sample_id for s in waiting})
        lost = [s for s in waiting if s.sample_id not in there]
        if lost:
            log.warning(
                "%d published samples are not on %s any more and were never trained: resent",
                len(lost),
                self.topics.samples,
            )
            self.metrics.samples.labels("resent").inc(len(lost))
            for sample in lost:
                await self.emit(self.topics.samples, sample.session_id, sample)

    async def on_topic(self, sample_ids: set[uuid.UUID], window: int = 20_000) -> set[uuid.UUID]:
        """Which of these samples are among the newest `window` records of each partition."""
        consumer = make_consumer(self.bootstrap)
        await consumer.start()
        found: set[uuid.UUID] = set()
        try:
            parts = await partitions_of(consumer, self.topics.samples)
            ends = await consumer.end_offsets(parts)
            firsts = await consumer.beginning_offsets(parts)
            starts = {tp: max(firsts[tp], ends[tp] - window) for tp in parts}
            async for record in read_to_end(consumer, starts):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    found.add(uuid.UUID(json.loads(record.value)["sample_id"]))
        finally:
            await consumer.stop()
        return found & sample_ids
