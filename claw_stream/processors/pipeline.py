"""What a worker does with each record, independent of Faust: the agents in `app.py` call it.

Outputs are published before the state that says they were (a crash in between re-emits the
same derived id, which consumers dedupe); samples go through an outbox in Postgres, so a
sample is never lost between "assembled" and "on the topic".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from claw_stream import weights
from claw_stream.bus.guard import TopicGuard, TopicWrongGauge, WriteGuard
from claw_stream.bus.kafka import (
    make_consumer,
    make_producer,
    partitions_of,
    read_to_end,
    send_all_past_reset,
)
from claw_stream.bus.topics import specs_for
from claw_stream.events import (
    DeadLetter,
    E,
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
from claw_stream.ids import judgement_id_of
from claw_stream.names import Topics
from claw_stream.processors import release
from claw_stream.processors.assemble import (
    assemble_session,
    episode_drafts,
    needs_judgements,
    turn_drafts,
)
from claw_stream.processors.config import PipelineConfig
from claw_stream.processors.judge import JudgeClient
from claw_stream.processors.own_events import OwnEvents
from claw_stream.processors.prompts import load_prompts
from claw_stream.processors.reward_sources import load_sources
from claw_stream.processors.reward_sources import session_metadata as merged_metadata
from claw_stream.processors.state import archive, judge_retries, outbox, segments
from claw_stream.processors.state.rows import Known, Pair
from claw_stream.processors.step_cache import StepCache
from claw_stream.processors.stitch import (
    CloseReason,
    classify,
    close_reason,
    drifts_of,
    in_time_order,
    main_line,
    stitch_session,
    stitched_together,
)
from claw_stream.store import consent
from claw_stream.store.db import make_engine
from claw_stream.store.locks import lock_sessions

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
        self.judge_timeouts = Counter(
            "claw_worker_judge_timeouts", "Judge requests that timed out after retries", registry=r
        )
        self.judge_deferred = Counter(
            "claw_worker_judge_deferred",
            "Turns the judge could not answer (timeouts, busy), kept to be judged again",
            registry=r,
        )
        self.judge_gave_up = Counter(
            "claw_worker_judge_gave_up",
            "Kept turns dead-lettered after worker.judge_give_up_after_s",
            registry=r,
        )
        self.judge_waiting = Gauge(
            "claw_worker_judge_waiting",
            "Turns kept to be judged again (all workers, as of this worker's last sweep)",
            registry=r,
        )
        self.judge_in_flight = Gauge(
            "claw_worker_judge_in_flight",
            "Judge requests sent or waiting for a slot (worker.judge_concurrency)",
            registry=r,
        )
        self.token_drift = Counter(
            "claw_token_drift",
            "Turns whose prompt ids did not continue the previous turn's prompt and answer ids "
            "where their messages did, by what was done (worker.token_drift: keep | drop)",
            ["action"],
            registry=r,
        )
        self.judge_prompts_cut = Counter(
            "claw_worker_judge_prompts_cut",
            "Turns whose judge prompt left out old history to fit the judge's context",
            registry=r,
        )
        self.steps = Counter(
            "claw_worker_steps",
            "Steps placed, by turn type as classified and why (header, first, extends, ...)",
            ["turn_type", "why"],
            registry=r,
        )
        self.segments = Counter(
            "claw_worker_segments_resumed",
            "Segments opened by steps after a close (a session resumed)",
            registry=r,
        )
        self.untrained = Counter(
            "claw_worker_turns_untrained",
            "Turns neither judged nor trained, by why: the step or its session switched off",
            ["why"],
            registry=r,
        )
        self.forgotten = Counter(
            "claw_worker_records_forgotten",
            "Records of forgotten sessions dropped unarchived",
            registry=r,
        )
        self.step_cache = _memory_gauges(
            "step_cache",
            (
                "JSON size of the decoded steps held in memory (worker.step_cache_mb)",
                "Steps of open segments the stitcher took from memory",
                "Steps of open segments the stitcher read and decoded from Postgres",
            ),
            r,
        )
        self.own_events = _memory_gauges(
            "own_events",
            (
                "Turns and judgements sent and held until read back (worker.own_events_mb)",
                "Turns and judgements read back as sent, taken without decoding",
                "Turns and judgements read that this worker did not send: decoded",
            ),
            r,
        )
        self.unconsidered = Counter(
            "claw_worker_steps_not_considered",
            "Steps archived but never placed for stitching, judging and training (should be 0)",
            registry=r,
        )

    @staticmethod
    def watch(gauges: dict[str, Gauge], held: StepCache | OwnEvents) -> None:
        """Gauges made by `_memory_gauges` read from `held` at each scrape."""
        for name, gauge in gauges.items():
            gauge.set_function(functools.partial(getattr, held, name))


def _memory_gauges(
    prefix: str, docs: tuple[str, str, str], registry: CollectorRegistry
) -> dict[str, Gauge]:
    """claw_worker_<prefix>_{bytes,hits,misses} of something the worker holds in memory."""
    return {
        name: Gauge(f"claw_worker_{prefix}_{name}", doc, registry=registry)
        for name, doc in zip(("bytes", "hits", "misses"), docs, strict=True)
    }


def close_decision(
    view: segments.SessionView, now: datetime, config: PipelineConfig
) -> CloseReason | None:
    """Whether a session closes now: ended with every counted step here (or waited long
    enough for missing ones), or idle."""
    if view.end_requested_at is not None:
        # the gateway counts a session's steps over all its segments
        complete = view.end_n_steps is None or max(view.n_steps, len(view.steps)) >= (
            view.end_n_steps
        )
        waited = (now - view.end_requested_at).total_seconds() >= config.reorder_grace_s
        if complete or waited:
            kind = "refreshed" if view.end_reason == "refreshed" else "ended"
            return close_reason(kind, view.end_reason)
        return None
    if view.last_step_at is None:
        return None
    idle_s = (now - view.last_step_at).total_seconds()
    return "idle_timeout" if idle_s >= config.idle_timeout_s else None


def _infra_retries() -> AsyncRetrying:
    """Retries while Postgres or the broker is away (INFRA_ERRORS), backing off to 10 s."""
    return AsyncRetrying(
        retry=retry_if_exception_type(INFRA_ERRORS),
        wait=wait_exponential(multiplier=0.5, max=10) + wait_random(0, 0.5),
        stop=stop_after_attempt(30),
        reraise=True,
    )


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
        # prompt files and reward plugins are read now: a bad one stops the worker at start
        self.prompts = load_prompts(config)
        self.sources = load_sources(config)
        self.metrics = WorkerMetrics()
        Info(
            "claw_worker", "This worker's consumer group and judge", registry=self.metrics.registry
        ).info({"app_id": config.app_id, "judge_url": config.judge_url})
        self.steps = StepCache(int(config.step_cache_mb * 2**20))
        self.metrics.watch(self.metrics.step_cache, self.steps)
        self.own = OwnEvents(int(config.own_events_mb * 2**20))
        self.metrics.watch(self.metrics.own_events, self.own)
        # nothing is written to a topic that differs from its spec (see bus/guard.py)
        self.guard = WriteGuard(TopicGuard(kafka_bootstrap, specs_for(self.topics)))
        self.metrics.registry.register(TopicWrongGauge("claw_worker_topic_wrong", self.guard.guard))
        self.producer: AIOKafkaProducer | None = None
        self.judge_client: JudgeClient | None = None
        self._started = False
        self._starting: asyncio.Lock | None = None
        self._ready: set[str] = set()  # sessions to release for at the end of the batch
        self._late: set[Pair] = set()  # segments whose episode reward came late
        self._turn_facts: dict[uuid.UUID, list[str] | None] = {}  # None: judged already
        self._turns_off: dict[uuid.UUID, bool] = {}  # whether a turn's session is switched off
        self._lost_check_at = 0.0
        self._judging_again: set[asyncio.Task[None]] = set()

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
        await self.guard.at_start()
        self.producer = make_producer(self.bootstrap)
        await self.producer.start()
        self.judge_client = client = JudgeClient(self.config, self.prompts, self.sources)
        self.metrics.judge_in_flight.set_function(lambda: client.in_flight)
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
        for task in list(self._judging_again):
            task.cancel()
        if self.judge_client is not None:
            await self.judge_client.aclose()
        await self.db.dispose()
        self._started = False

    # -- plumbing -----------------------------------------------------------------------------

    async def emit(self, topic: str, key: str, event: Event) -> None:
        await self.emit_all(topic, [(key, event)])

    async def emit_all(self, topic: str, events: Sequence[tuple[str, Event]]) -> None:
        """Send every (key, event) in order, then wait for all their acks at once."""
        if not events:
            return
        assert self.producer is not None
        await self.guard.before_write(topic)
        records = [(key.encode(), encode_event(event)) for key, event in events]
        # held before the send: this worker's own agent may fetch them before the ack is back
        held = topic in (self.topics.turns, self.topics.judgements)
        if held:
            for (_, raw), (_, event) in zip(records, events, strict=True):
                self.own.sent(raw, event, getattr(event, "session_id", ""))
        try:
            await send_all_past_reset(self.producer, topic, records)
        except BaseException as exc:
            if held:
                self.own.discard([raw for _, raw in records])
            if isinstance(exc, KafkaError):
                self.guard.failed()
            raise

    def _decode(self, model: type[E], raw: bytes) -> E:
        """A record's event: the one this worker sent when the bytes are exactly those it
        encoded (see own_events.py), else decoded and validated (EventError when bad)."""
        return self._own(model, raw) or decode_event(model, raw)

    def _own(self, model: type[E], raw: bytes) -> E | None:
        """The event this worker sent as `raw`; None for any other record, and for steps and
        session events (never sent from here) without looking."""
        return self.own.take(model, raw) if model in (Turn, Judgement) else None

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
        known = await self._archive_judgements(records) if processor == "assemble" else None
        if known is not None:
            await self.flush_releases(known)
            return
        decoded: dict[int, Event] = {}  # by id(record): decoded once
        if processor == "judge" and len(records) > 1:
            decoded = await self._prefetch_turns(records)
        if processor == "stitch" and by_session:
            groups = dict(enumerate(await self._stitch_batch(list(groups.values()))))

        async def run(group: list[Record]) -> None:
            async with slots:
                stitch_at_once = processor == "stitch" and by_session and len(group) > 1
                if stitch_at_once and await self._stitch_group(group):
                    return
                for r in group:
                    await self.handle(
                        processor,
                        r.topic,
                        r.value,
                        partition=r.partition,
                        offset=r.offset,
                        key=r.key,
                        event=decoded.get(id(r)),
                    )

        await asyncio.gather(*(run(g) for g in groups.values()))
        await self.flush_releases()

    async def flush_releases(self, known: Known | None = None) -> None:
        """One release pass for every session a handled batch made ready (see `release_pass`);
        what a crash here leaves behind, the sweeper's pass takes."""
        if not self._ready and not self._late:
            return
        sessions, self._ready = sorted(self._ready), set()
        late, self._late = list(self._late), set()
        async for attempt in _infra_retries():
            with attempt:
                await self.release_pass(sessions, late, known)

    def _decode_all(
        self, processor: str, records: list[Record], texts: dict[uuid.UUID, str] | None = None
    ) -> list[Any] | None:
        """Every record's event, or None when one does not decode. `texts`: filled with the
        JSON of the events this worker sent as they were read back (exactly `encode_event`'s)."""
        out = []
        for r in records:
            model, _ = self._route(processor, r.topic)
            raw = r.value or b""
            event = self._own(model, raw)
            if event is not None and texts is not None:
                texts[event.id] = raw.decode()
            try:
                out.append(event or decode_event(model, raw))
            except EventError:
                return None
        return out

    async def _archive_judgements(self, records: list[Record]) -> Known | None:
        """A batch of judgements archived in one statement (one transaction per judgement cost
        more than the insert): those it stored. None when one does not decode: then each goes
        its own way."""
        texts: dict[uuid.UUID, str] = {}
        judgements = self._decode_all("assemble", records, texts)
        if judgements is None:
            return None
        self.metrics.records.labels("assemble").inc(len(judgements))
        try:
            async for attempt in _infra_retries():
                with attempt:
                    async with self.db.begin() as conn:
                        known = await archive.archive_judgements(conn, judgements, texts)
        except Exception:
            log.exception("archiving %d judgements at once failed", len(judgements))
            return None
        self._ready.update(j.session_id for j in judgements)
        return known

    async def _prefetch_turns(self, records: list[Record]) -> dict[int, Event]:
        """Which turns of a batch were judged already, what feedback text each has and whether
        its session is switched off, in three queries for the batch instead of three
        transactions per turn (`on_turn` falls back to its own). The turns that decode, by
        id(record)."""
        decoded: dict[int, Event] = {}
        for r in records:
            turns = self._decode_all("judge", [r])  # a bad one is left to `handle`
            if turns:
                decoded[id(r)] = turns[0]
        found = [t for t in decoded.values() if isinstance(t, Turn)]
        if not found:
            return decoded
        try:
            async with self.db.connect() as conn:
                facts = await archive.turn_facts(conn, found)
                off = await consent.untrainable(conn, {t.session_id for t in found})
        except INFRA_ERRORS:
            return decoded
        self._turn_facts.update(facts)
        self._turns_off.update({t.turn_id: t.session_id in off for t in found})
        return decoded

    async def _stitch_group(self, group: list[Record]) -> bool:
        """A session's records of one batch in one transaction: one lock, one load of the open
        segment, one stitch (per step, the lock and the segment's load were most of its
        statements). False, with nothing done, when a record does not decode or its handling
        fails for another reason than the infrastructure: then each record goes its own way
        (and the bad one to the DLQ)."""
        events: list[Step | SessionEvent] = []
        for r in group:
            model, _ = self._route("stitch", r.topic)
            try:
                events.append(self._decode(model, r.value or b""))  # type: ignore[arg-type]
            except EventError:
                return False
        session_id = events[0].session_id
        if any(e.session_id != session_id for e in events):
            return False
        events = in_time_order(events)
        self.metrics.records.labels("stitch").inc(len(events))
        try:
            async for attempt in _infra_retries():
                with attempt:
                    await self._stitch_all(session_id, events)
        except Exception:
            log.exception("stitching %d records of %s at once failed", len(events), session_id)
            return False
        return True

    async def _stitch_all(self, session_id: str, events: list[Step | SessionEvent]) -> None:
        async with self.db.begin() as conn:
            await segments.lock_session(conn, session_id)
            if await self._dropped_as_forgotten(conn, session_id, len(events)):
                return
            closed = await self._stitch_locked(conn, session_id, events)
        if closed:
            self._ready.add(session_id)

    async def _stitch_locked(
        self, conn: AsyncConnection, session_id: str, events: list[Step | SessionEvent]
    ) -> bool:
        """A session's records in order, under its lock; whether a segment closed."""
        closed_any = False
        view: segments.SessionView | None = None
        dirty = False
        for event in events:
            if isinstance(event, Step):
                await archive.archive_step(conn, event)
                placed = await segments.place_step(conn, event)
                if view is None or (placed is not None and placed[1]):
                    view = await segments.session_view(conn, session_id, self.steps)
                if placed is not None and view is not None:
                    await self._place(conn, event, placed, view)
                dirty = True
                continue
            await segments.archive_event(conn, event)
            if event.kind in ("ended", "refreshed"):
                closed = await self._ended(conn, event)
                closed_any |= closed is not None
                view, dirty = None, False
            elif event.kind == "reward" and event.step_id is None:
                segment, _ = await segments.current_segment(conn, session_id)
                self._late.add((session_id, segment))
                self._ready.add(session_id)
        if dirty:
            closed = await self._advance(conn, session_id, view)
            closed_any |= closed is not None
        return closed_any

    async def _stitch_batch(self, groups: list[list[Record]]) -> list[list[Record]]:
        """The sessions of a batch in one transaction (`_stitch_sessions`); the groups left to
        handle one by one: those with a record that does not decode or names another session
        than its group's (the bad one goes to the DLQ), all of them when the batch failed for
        another reason than the infrastructure."""
        sessions: dict[str, list[Step | SessionEvent]] = {}
        rest: list[list[Record]] = []
        for group in groups:
            events = self._decode_all("stitch", group)
            ids = {e.session_id for e in events or []}
            if events is None or len(ids) != 1 or ids & set(sessions):
                rest.append(group)
                continue
            sessions[ids.pop()] = in_time_order(events)
        if not sessions:
            return rest
        n = sum(len(events) for events in sessions.values())
        try:
            async for attempt in _infra_retries():
                with attempt:
                    closed = await self._stitch_sessions(sessions)
        except Exception:
            log.exception("stitching %d records of %d sessions at once failed", n, len(sessions))
            return groups
        self.metrics.records.labels("stitch").inc(n)
        self._ready.update(closed)
        return rest

    async def _stitch_sessions(self, sessions: dict[str, list[Step | SessionEvent]]) -> set[str]:
        """Records of many sessions, each session's in order, under all their locks in one
        transaction; the sessions whose segment closed. Those whose records may close and
        reopen a segment go one by one (`_stitch_locked`), the others together.

        Per session and step, the statements of a stitch were most of the worker's time (the
        bench's stitch agent took ~0.8 s for a batch of 200 records); together, a batch costs
        about fifteen statements however many sessions it holds."""
        closed: set[str] = set()
        async with self.db.begin() as conn:
            ids = sorted(sessions)
            await lock_sessions(conn, ids)
            gone = await consent.forgotten(conn, ids)
            self.steps.drop_sessions(gone)
            self.own.drop_sessions(gone)
            for session_id in gone:
                self.metrics.forgotten.inc(len(sessions[session_id]))
            live = [s for s in ids if s not in gone]
            where = await segments.current_segments(conn, live)
            together: dict[str, list[Step | SessionEvent]] = {}
            for session_id in live:
                events = sessions[session_id]
                if stitched_together(events, where.get(session_id, (0, False))[1]):
                    together[session_id] = events
                elif await self._stitch_locked(conn, session_id, events):
                    closed.add(session_id)
            if together:
                closed |= await self._stitch_together(conn, together, where)
        return closed

    async def _stitch_together(
        self,
        conn: AsyncConnection,
        sessions: dict[str, list[Step | SessionEvent]],
        where: dict[str, tuple[int, bool]],
    ) -> set[str]:
        """`_stitch_locked` for sessions whose records leave their open segment the one open
        (`stitched_together`), every statement made once for all of them; the sessions whose
        segment closed. Each session's events go to its open segment and its steps are placed
        in it, then it advances once, as `_stitch_locked` does after its last step or end."""
        await archive.archive_events(
            conn,
            [
                (e, where.get(session_id, (0, False))[0], False)
                for session_id, events in sessions.items()
                for e in events
                if isinstance(e, SessionEvent)
            ],
        )
        steps = [e for events in sessions.values() for e in events if isinstance(e, Step)]
        await archive.archive_steps(conn, steps, self.steps)
        placed = await segments.placed_steps(conn, [s.step_id for s in steps])
        moving = [
            session_id
            for session_id, events in sessions.items()
            if any(isinstance(e, Step) or e.kind in ("ended", "refreshed") for e in events)
        ]
        # archiving made the row of each: a step's upsert or an end's
        views = await segments.session_views(conn, moving, self.steps)
        opened: list[Pair] = []
        placements: list[segments.Placement] = []
        writes = segments.StitchWrites()
        closed: set[str] = set()
        for session_id in moving:
            view = views[session_id]
            for step in sessions[session_id]:
                if not isinstance(step, Step) or step.step_id in placed:
                    continue  # an event, or a step placed before (a redelivery)
                placed.add(step.step_id)
                if view.n_steps == 0:
                    opened.append((session_id, view.segment))
                placements.append(self._placement(step, view.segment, view))
            if self._stitch(session_id, view, writes) is not None:
                closed.add(session_id)
        await segments.open_segments(conn, opened)
        await segments.record_placements(conn, placements)
        await self._write_stitched(conn, writes)
        return closed

    async def _dropped_as_forgotten(
        self, conn: AsyncConnection, session_id: str, n_records: int = 1
    ) -> bool:
        """True (and counted) when the session was forgotten: its records are not archived.
        Asked under the session's lock, which forget also takes."""
        if not await consent.forgotten(conn, [session_id]):
            return False
        self.steps.drop_sessions([session_id])
        self.own.drop_sessions([session_id])
        self.metrics.forgotten.inc(n_records)
        return True

    async def _place(
        self,
        conn: AsyncConnection,
        step: Step,
        placed: tuple[int, bool],
        view: segments.SessionView,
    ) -> None:
        """Classify a new step against the open segment's main line, record where it went and
        add it to `view`."""
        segment, opened = placed
        if opened:
            self.metrics.segments.inc()
        await segments.record_placement(conn, *self._placement(step, segment, view))

    def _placement(
        self, step: Step, segment: int, view: segments.SessionView
    ) -> segments.Placement:
        """Classify a new step against the open segment's main line and add it to `view`."""
        turn_type, why = classify(step, main_line(view.steps))
        self.metrics.steps.labels(turn_type, why).inc()
        view.steps.append(step.model_copy(update={"turn_type": turn_type}))
        view.segments[step.step_id] = segment
        view.arrived_at[step.step_id] = datetime.now(UTC)
        view.n_steps += 1
        return step, segment, turn_type, why

    async def handle(
        self,
        processor: str,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
        event: Event | None = None,
    ) -> None:
        """Decode one record (unless `event` is the record decoded already) and run its
        handler; bad input and failures go to the DLQ, infrastructure errors are retried (the
        record is not acknowledged meanwhile)."""
        model, handler = self._route(processor, topic)
        self.metrics.records.labels(processor).inc()
        try:
            event = event or self._decode(model, value or b"")
        except EventError as exc:
            await self.dead_letter(
                processor, topic, value, exc, partition=partition, offset=offset, key=key
            )
            return
        try:
            async for attempt in _infra_retries():
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
        async with self.db.begin() as conn:
            await segments.lock_session(conn, step.session_id)
            if await self._dropped_as_forgotten(conn, step.session_id):
                return
            await archive.archive_step(conn, step)
            placed = await segments.place_step(conn, step)
            view = await segments.session_view(conn, step.session_id, self.steps)
            if view is None:  # archive_step made the row: only a foreign archive can skip it
                self.metrics.unconsidered.inc()
                log.error("step %s of %s archived but not placed", step.step_id, step.session_id)
                return
            if placed is not None:
                await self._place(conn, step, placed, view)
            closed = await self._advance(conn, step.session_id, view)
        if closed is not None:
            self._ready.add(step.session_id)

    async def on_session_event(self, event: SessionEvent) -> None:
        closed: CloseReason | None = None
        async with self.db.begin() as conn:
            await segments.lock_session(conn, event.session_id)
            if await self._dropped_as_forgotten(conn, event.session_id):
                return
            await segments.archive_event(conn, event)
            if event.kind in ("ended", "refreshed"):
                closed = await self._ended(conn, event)
        if closed is not None:
            self._ready.add(event.session_id)
        elif event.kind == "reward" and event.step_id is None:
            async with self.db.connect() as conn:
                segment, _ = await segments.current_segment(conn, event.session_id)
            self._late.add((event.session_id, segment))
            self._ready.add(event.session_id)

    async def advance(self, session_id: str) -> None:
        """Emit the session's new turns; close it when it ended (or idled) completely."""
        async with self.db.begin() as conn:
            await segments.lock_session(conn, session_id)
            closed = await self._advance(conn, session_id)
        if closed is not None:
            self._ready.add(session_id)

    async def _advance(
        self, conn: AsyncConnection, session_id: str, view: segments.SessionView | None = None
    ) -> CloseReason | None:
        """`advance` inside a transaction that holds the session's lock; the close reason when
        the open segment closed (the caller assembles it once the transaction committed).

        With per_turn release an idle close keeps the segment's last main step open (its
        `tail`): when the conversation resumes, the user's next message is its next state, so
        the turn before a pause is judged like any other."""
        view = view or await segments.session_view(conn, session_id, self.steps)
        if view is None:
            return None
        writes = segments.StitchWrites()
        closed = self._stitch(session_id, view, writes)
        await self._write_stitched(conn, writes)
        return closed

    def _stitch(
        self, session_id: str, view: segments.SessionView, writes: segments.StitchWrites
    ) -> CloseReason | None:
        """What `_advance` writes for the session, added to `writes`; the close reason when its
        open segment closes."""
        if view.closed_at is not None:
            return None
        now = datetime.now(UTC)
        closed = close_decision(view, now, self.config)
        turns = stitch_session(
            view.steps,
            closed=closed,
            now=now,
            reorder_grace_s=self.config.reorder_grace_s,
            arrived_at=view.arrived_at,
            settled_through=view.settled_through,
            segment=view.segment,
            segments=view.segments,
        )
        tail: uuid.UUID | None = None
        hold = closed == "idle_timeout" and self.config.release_mode == "per_turn"
        if hold and turns and turns[-1].is_last:
            tail = turns.pop().step.step_id
        # a step's drift is found while its predecessor is in view, kept for its turn, which
        # may come in a later view (after an idle close its step is the next segment's tail)
        found = drifts_of(main_line(view.steps), view.emitted)
        writes.drifts.update(found)
        drifts = {**view.drifts, **found}
        new = [
            t.model_copy(update={"token_drift": drifts[t.step.step_id]})
            if t.step.step_id in drifts
            else t
            for t in turns
            if t.turn_id not in view.emitted
        ]
        for turn in new:
            self.metrics.turns.labels(turn.closed_reason).inc()
        writes.turns += new
        off = [(t, judgement_id_of(t.turn_id)) for t in new if not t.step.train]
        writes.skipped += off
        self.metrics.untrained.labels("step").inc(len(off))
        if view.tail_segment is not None and any(t.step.step_id == view.tail for t in new):
            writes.tails_cleared.append((session_id, view.tail_segment))
        if closed is not None:
            # an earlier segment's tail that is still the last main step stays that segment's
            own_tail = tail if tail != view.tail else None
            writes.closes.append((session_id, view.segment, closed, own_tail))
        return closed

    async def _write_stitched(self, conn: AsyncConnection, writes: segments.StitchWrites) -> None:
        """Publish the new turns to judge, then write what says they were."""
        trained = [(t.session_id, t) for t in writes.turns if t.step.train]
        await self.emit_all(self.topics.turns, trained)
        await segments.write_stitched(conn, writes)

    async def close_tail(self, session_id: str) -> None:
        """A tail that waited `tail_timeout_s` for the conversation to resume: its turn is
        judged without a next state, so its segment can be assembled."""
        async with self.db.begin() as conn:
            await segments.lock_session(conn, session_id)
            await self._emit_tails(conn, session_id, self.config.tail_timeout_s, "idle_timeout")
        self._ready.add(session_id)

    async def _emit_tails(
        self, conn: AsyncConnection, session_id: str, waited_s: float, reason: CloseReason
    ) -> bool:
        """The session's held tails (that waited `waited_s`) as turns without a next state."""
        tails = await outbox.due_tails(conn, session_id, waited_s)
        for segment, step in tails:
            (turn,) = stitch_session([step], closed=reason, segment=segment)
            await self.emit(self.topics.turns, session_id, turn)
            self.metrics.turns.labels(turn.closed_reason).inc()
            await archive.record_turns(conn, [turn])
            await segments.clear_tail(conn, session_id, segment)
        return bool(tails)

    async def _ended(self, conn: AsyncConnection, event: SessionEvent) -> CloseReason | None:
        """An end or refresh: closes the open segment; one that comes after the worker closed
        it by idle (the gateway ends a session after its own, longer idle timeout, and a key
        then moves to a new session) ends the wait of the held tail: no resume will come."""
        closed = await self._advance(conn, event.session_id)
        if closed is None:
            _, already = await segments.current_segment(conn, event.session_id)
            reason = close_reason(event.kind, event.reason)
            if already and await self._emit_tails(conn, event.session_id, 0.0, reason):
                self._ready.add(event.session_id)
        return closed

    # -- judge ----------------------------------------------------------------------------------

    async def on_turn(self, turn: Turn) -> bool:
        """Judge a turn; False when the judge could not answer and it was kept for later."""
        off = self._turns_off.pop(turn.turn_id, None)
        if turn.turn_id in self._turn_facts:
            facts = self._turn_facts.pop(turn.turn_id)
            if facts is None:
                return True  # redelivered: judged already
            feedback = facts
        else:
            async with self.db.connect() as conn:
                if await archive.judged(conn, judgement_id_of(turn.turn_id)):
                    return True  # redelivered: judged already
                feedback = await outbox.feedback_texts(conn, turn)
        if turn.token_drift is not None:
            self.metrics.token_drift.labels(self.config.token_drift).inc()
            log.info("turn %s: %s", turn.turn_id, turn.token_drift)
        if turn.token_drift is not None and self.config.token_drift == "drop":
            async with self.db.begin() as conn:
                await archive.skip_judging(conn, [(turn, judgement_id_of(turn.turn_id))])
            await self.dead_letter(
                "judge",
                self.topics.turns,
                encode_event(turn),
                RuntimeError(turn.token_drift),
                key=turn.session_id,
            )
            return True
        if off is None:
            async with self.db.connect() as conn:
                off = bool(await consent.untrainable(conn, [turn.session_id]))
        if off:
            # switched off (or forgotten) after the turn was stitched: never judged
            async with self.db.begin() as conn:
                await archive.skip_judging(conn, [(turn, judgement_id_of(turn.turn_id))])
            self.metrics.untrained.labels("session").inc()
            return True
        metadata: dict[str, Any] = {}
        if self.sources:
            async with self.db.connect() as conn:
                metadata = merged_metadata(await outbox.session_events(conn, turn.session_id))
        assert self.judge_client is not None
        with self.metrics.judge_seconds.time():
            outcome = await self.judge_client.judge(turn, feedback, metadata)
        if outcome.judgement.history_cut:
            self.metrics.judge_prompts_cut.inc()
        if outcome.errors:
            self.metrics.judge_errors.inc(len(outcome.errors))
            self.metrics.judge_timeouts.inc(outcome.timeouts)
            error = "; ".join(outcome.errors)[:4000]
            if outcome.busy:
                async with self.db.begin() as conn:
                    kept = await judge_retries.defer_judging(conn, turn, error, self._backoff)
                    if kept.waited_s < self.config.judge_give_up_after_s:
                        self.metrics.judge_deferred.inc()
                        log.info(
                            "judge busy on turn %s (attempt %d): judged again later: %s",
                            turn.turn_id,
                            kept.attempts,
                            error[:200],
                        )
                        return False
                    await judge_retries.give_up_judging(conn, turn.turn_id)
                self.metrics.judge_gave_up.inc()
                error = (
                    f"judge_unavailable: no answer in {kept.waited_s:.0f} s, {kept.attempts} "
                    f"attempts (worker.judge_give_up_after_s): {error}"
                )[:4000]
            await self.dead_letter(
                "judge",
                self.topics.turns,
                encode_event(turn),
                RuntimeError(error),
                key=turn.session_id,
            )
        await self.emit(self.topics.judgements, turn.session_id, outcome.judgement)
        return True

    def _backoff(self, attempts: int) -> float:
        """Seconds before a kept turn is judged again: 5, 10, 20, ... up to the maximum."""
        return min(self.config.judge_backoff_max_s, 5.0 * 2 ** min(attempts - 1, 16))

    async def judge_again(self) -> None:
        """Start judging kept turns whose time has come, in the background: a judge that
        takes minutes must not hold up the sweeper's other work."""
        c = self.config
        room = c.judge_concurrency - len(self._judging_again)
        if room > 0:
            # leased for as long as one judging may take (every request, every retry)
            lease = c.judge_timeout_s * (c.judge_retries + 1) * 3 + 60
            async with self.db.begin() as conn:
                due = await judge_retries.judging_due(conn, lease, room)
            for turn in due:
                task = asyncio.create_task(self._judge_kept(turn))
                self._judging_again.add(task)
                task.add_done_callback(self._judging_again.discard)
        async with self.db.connect() as conn:
            self.metrics.judge_waiting.set(await judge_retries.judging_waiting(conn))

    async def _judge_kept(self, turn: Turn) -> None:
        try:
            if await self.on_turn(turn):
                async with self.db.begin() as conn:
                    await judge_retries.judged_again(conn, turn.turn_id)
        except Exception:
            log.exception("judging kept turn %s again failed; its lease runs out", turn.turn_id)

    # -- assemble -------------------------------------------------------------------------------

    async def on_judgement(self, judgement: Judgement) -> None:
        async with self.db.begin() as conn:
            await archive.archive_judgement(conn, judgement)
        self._ready.add(judgement.session_id)

    async def try_assemble(self, session_id: str, late_reward: bool = False) -> None:
        late: list[Pair] = []
        if late_reward:
            async with self.db.connect() as conn:
                segment, _ = await segments.current_segment(conn, session_id)
            late = [(session_id, segment)]
        await self.release_pass([session_id], late)

    async def release_pass(
        self,
        sessions: list[str] | None,
        late: list[Pair] | None = None,
        known: Known | None = None,
    ) -> None:
        """Assemble what is ready, for these sessions (None: any), in one transaction whatever
        their number: per_turn, each judged turn whose signals are final becomes its sample;
        each closed segment with every turn judged is assembled (per_episode: all its samples;
        per_turn: its episode-reward samples and the at-least-one rule).

        Batched across sessions: a pass costs about ten statements however many turns it
        releases, where one session at a time cost about as many per session (the worker
        then ran at ~52 steps/s in bench/pipeline_bench.py). Sample ids are derived and the
        insert returns only new rows, so concurrent passes (every worker's sweeper) never
        publish a sample twice; judgements are taken FOR UPDATE SKIP LOCKED."""
        c = self.config
        per_turn = c.release_mode == "per_turn"
        to_publish: list[Sample] = []
        counts: dict[str, int] = {}

        def count(more: dict[str, int]) -> None:
            for k, v in more.items():
                counts[k] = counts.get(k, 0) + v

        topic = self.topics.samples
        async with self.db.begin() as conn:
            due = (
                await outbox.due_judgements(conn, sessions, c.signal_grace_s, known=known)
                if per_turn
                else []
            )
            if due:
                await outbox.mark_sampled(conn, [j.judgement_id for j in due])
            segments = await outbox.segments_to_assemble(conn, sessions, late, per_turn)
            if not due and not segments:
                return
            gate = await outbox.gate(conn, self.policy, c.update_timeout_s)
            pairs = {(j.session_id, j.turn.segment or 0) for j in due} | set(segments)
            events, steps = await outbox.segment_signals(conn, pairs)
            by_pair: dict[Pair, list[Judgement]] = {}
            for j in due:
                by_pair.setdefault((j.session_id, j.turn.segment or 0), []).append(j)
            drafts = [
                d
                for pair, js in by_pair.items()
                for d in turn_drafts(js, steps[pair], events[pair], c, topic)
            ]
            # per_turn: only an episode reward needs the judgements again (reading and decoding
            # every closed segment's was ~5% of the worker's CPU in bench/pipeline_bench.py)
            needed = [p for p in segments if not per_turn or needs_judgements(events[p], c)]
            of_segment = await outbox.segment_judgements(conn, needed, known)
            for pair in segments:
                judgements = of_segment.get(pair, [])
                if per_turn:
                    drafts += episode_drafts(judgements, events[pair], c, topic)
                else:
                    drafts += assemble_session(judgements, events[pair], c, topic)
            off = await consent.untrainable(
                conn, {d.sample.session_id for d in drafts} | {s for s, _ in segments}
            )
            if off:  # switched off while judged: their samples are never made
                drafts = [d for d in drafts if d.sample.session_id not in off]
            out, n = await outbox.store_samples(
                conn, release.decide(drafts, gate, c.max_staleness), topic
            )
            to_publish += out
            count(n)
            if segments:
                if not per_turn:
                    await outbox.mark_sampled(
                        conn, [j.judgement_id for js in of_segment.values() for j in js]
                    )
                signal = await outbox.signal_counts(conn, segments)
                if per_turn and c.at_least_one_per_session:
                    for pair in [p for p in segments if not signal[p] and p[0] not in off]:
                        last = await outbox.last_without_signal(conn, pair)
                        if last is None:
                            continue
                        decided = release.decide_held([last], gate, c.max_staleness)
                        await outbox.set_released(conn, decided)
                        status, sample = decided[0]
                        if status == "pending":
                            to_publish.append(sample)
                        count({status: 1, "no_signal": -1})
                        signal[pair] = int(status != "dropped")
                await outbox.mark_assembled(conn, signal)
        for status, k in counts.items():
            if k > 0:
                self.metrics.samples.labels(status).inc(k)
        await self.publish_samples(to_publish)

    async def publish_samples(self, samples: list[Sample]) -> None:
        """Send all, then wait for every ack at once (acks=all each), then mark them."""
        if not samples:
            return
        await self.emit_all(self.topics.samples, [(s.session_id, s) for s in samples])
        await outbox.mark_published(self.db, [s.sample_id for s in samples])

    async def on_weight(self, event: WeightEvent) -> None:
        async with self.db.begin() as conn:
            await weights.record(conn, event)
        if event.status != "updating":
            await self.release()

    async def release(self) -> None:
        c = self.config
        async with self.db.begin() as conn:
            gate = await outbox.gate(conn, self.policy, c.update_timeout_s)
            if gate.updating:
                return
            decided = release.decide_held(await outbox.held_samples(conn), gate, c.max_staleness)
            await outbox.set_released(conn, decided)
        samples = [sample for status, sample in decided if status == "pending"]
        dropped = len(decided) - len(samples)
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
            due = await segments.sessions_to_sweep(
                conn, self.config.idle_timeout_s, self.config.reorder_grace_s
            )
        for session_id in due:
            await self.advance(session_id)
        async with self.db.connect() as conn:
            tails = await segments.tails_due(conn, self.config.tail_timeout_s)
        for session_id in tails:
            await self.close_tail(session_id)
        await self.judge_again()
        self._ready.clear()  # this pass takes them all
        await self.release_pass(None)
        await self.release()
        async with self.db.begin() as conn:
            lost = await outbox.orphans(conn, self.config.orphan_after_s)
        if lost:
            # a worker died between publishing and marking: send only what is not there yet
            there = await self.on_topic({s.sample_id for s in lost})
            await outbox.mark_published(self.db, list(there))
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
            waiting = await outbox.untrained(conn, self.config.retrain_after_s)
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
