"""`claw-stream replay`: the same stitch / judge / assemble code over a time range of the
recorded traffic, with another configuration, into a new samples topic.

The source is `claw.steps` + `claw.session-events` (Kafka) or the archive in Postgres (the
embedded broker keeps topics in memory only). Each session in the range is taken as closed at
the end of the range. Re-derived samples are not gated by weight updates: they are released at
the newest policy version seen in the range.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from claw_stream.bus.kafka import make_consumer, make_producer, partitions_of, publish, read_to_end
from claw_stream.bus.topics import apply_topics, load_specs
from claw_stream.events import EventError, Judgement, SessionEvent, Step, Turn, decode_event
from claw_stream.names import Topics
from claw_stream.store import consent
from claw_stream.store import models as m
from claw_stream.store.db import make_engine
from claw_stream.timerange import TimeRange
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.judge_client import JudgeClient
from claw_stream.worker.logic.samples import assemble_session
from claw_stream.worker.logic.turns import CloseReason, close_reason, held_out, stitch_session
from claw_stream.worker.prompt_files import load_prompts
from claw_stream.worker.reward_sources import load_sources, session_metadata

Progress = Callable[[str, int, int | None], None]  # (phase, advance, total)


@dataclass
class RederiveReport:
    steps: int = 0
    events: int = 0
    invalid: int = 0
    sessions: int = 0
    turns: int = 0
    judge_errors: int = 0
    samples: int = 0
    no_signal: int = 0
    withheld_sessions: int = 0  # forgotten or switched off: never re-derived
    untrained_turns: int = 0  # turns of steps recorded with train false
    held_out_turns: int = 0  # turns held out for the replay of held-out turns, never trained
    by_source: dict[str, int] = field(default_factory=dict)


async def read_kafka(
    bootstrap: str,
    topics: Topics,
    since: datetime,
    until: datetime | None,
    report: RederiveReport,
    progress: Progress,
) -> tuple[list[Step], list[SessionEvent]]:
    """Both topics from `since` (offsets_for_times) to their end offsets at the start.

    Events are also filtered by their own `created_at`: a broker may answer offsets_for_times
    with the first offset whatever the time (Tansu does).
    """
    consumer = make_consumer(bootstrap, enable_auto_commit=False)
    await consumer.start()
    steps: list[Step] = []
    events: list[SessionEvent] = []
    try:
        parts = await partitions_of(consumer, topics.steps, topics.session_events)
        if not parts:
            raise RuntimeError(f"topics {topics.steps} / {topics.session_events} not found")
        ends = await consumer.end_offsets(parts)
        since_ms = int(since.timestamp() * 1000)
        found = await consumer.offsets_for_times({tp: since_ms for tp in parts})
        starts = {tp: found[tp].offset if found.get(tp) else ends[tp] for tp in parts}
        progress("read", 0, sum(max(0, ends[tp] - starts[tp]) for tp in parts))
        async for record in read_to_end(consumer, starts):
            model = Step if record.topic == topics.steps else SessionEvent
            progress("read", 1, None)
            try:
                event = decode_event(model, record.value or b"")
            except EventError:
                report.invalid += 1
                continue
            if event.created_at in TimeRange(since, until):
                (steps if model is Step else events).append(event)  # type: ignore[arg-type]
    finally:
        await consumer.stop()
    return steps, events


async def read_postgres(
    database_url: str, since: datetime, until: datetime | None, report: RederiveReport
) -> tuple[list[Step], list[SessionEvent]]:
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            query = select(m.StepPayload.payload).where(m.StepPayload.created_at >= since)
            rows = await conn.execute(query)
            steps = [decode_event(Step, json.dumps(p)) for (p,) in rows]
            rows = await conn.execute(
                select(m.SessionEventRow.payload).where(m.SessionEventRow.created_at >= since)
            )
            events = [decode_event(SessionEvent, json.dumps(p)) for (p,) in rows]
    finally:
        await engine.dispose()
    window = TimeRange(since, until)
    steps = [s for s in steps if s.created_at in window]
    events = [e for e in events if e.created_at in window]
    return steps, events


def switched_off(events: list[SessionEvent]) -> set[str]:
    """Sessions the recorded events forget, or whose training was last switched off."""
    out: set[str] = set()
    last_switch: dict[str, tuple[datetime, bool]] = {}
    for e in events:
        if e.kind == "forgotten":
            out.add(e.session_id)
        elif e.kind == "train" and e.train is not None:
            seen = last_switch.get(e.session_id)
            if seen is None or e.created_at >= seen[0]:
                last_switch[e.session_id] = (e.created_at, e.train)
    return out | {s for s, (_, train) in last_switch.items() if not train}


async def withheld(database_url: str, session_ids: set[str]) -> set[str]:
    """Of these sessions, those the archive says are forgotten or switched off."""
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            return await consent.untrainable(conn, session_ids)
    except (OSError, SQLAlchemyError) as exc:
        raise RuntimeError(
            f"cannot check which sessions were forgotten or switched off ({exc}); "
            "replay needs the Postgres archive for that"
        ) from exc
    finally:
        await engine.dispose()


def stitch_all(
    steps: list[Step], events: list[SessionEvent], config: WorkerSettings
) -> tuple[dict[str, list[Turn]], dict[str, list[SessionEvent]]]:
    by_session: dict[str, list[Step]] = defaultdict(list)
    for step in steps:
        by_session[step.session_id].append(step)
    events_of: dict[str, list[SessionEvent]] = defaultdict(list)
    for event in events:
        events_of[event.session_id].append(event)
    turns: dict[str, list[Turn]] = {}
    for session_id, session_steps in by_session.items():
        ends = [e for e in events_of[session_id] if e.kind in ("ended", "refreshed")]
        reason: CloseReason = close_reason(ends[0].kind, ends[0].reason) if ends else "idle_timeout"
        turns[session_id] = stitch_session(
            session_steps, closed=reason, reorder_grace_s=config.reorder_grace_s
        )
    return turns, events_of


async def rederive(
    *,
    config: WorkerSettings,
    topics: Topics,
    kafka_bootstrap: str,
    database_url: str,
    source: str,
    since: datetime,
    until: datetime | None,
    to_topic: str,
    progress: Progress = lambda phase, n, total: None,
    holdout_share: float = 0.0,
) -> RederiveReport:
    report = RederiveReport()
    # prompt files and reward plugins first: a bad one fails before anything is read
    prompts, sources = load_prompts(config), load_sources(config)
    if source == "kafka":
        steps, events = await read_kafka(kafka_bootstrap, topics, since, until, report, progress)
    else:
        steps, events = await read_postgres(database_url, since, until, report)
    report.steps, report.events = len(steps), len(events)
    off = switched_off(events) | await withheld(database_url, {s.session_id for s in steps})
    report.withheld_sessions = len(off & {s.session_id for s in steps})
    steps = [s for s in steps if s.session_id not in off]
    events = [e for e in events if e.session_id not in off]
    turns, events_of = stitch_all(steps, events, config)
    for session_id, session_turns in turns.items():
        kept = [t for t in session_turns if t.step.train]
        report.untrained_turns += len(session_turns) - len(kept)
        # held out live (eval.holdout_share): the replay's versions are compared on them too
        trained = [t for t in kept if not held_out(t, holdout_share)]
        report.held_out_turns += len(kept) - len(trained)
        kept = trained
        turns[session_id] = kept
    report.sessions = len(turns)
    report.turns = sum(len(t) for t in turns.values())
    released_at = max((s.weight_version for s in steps), default=0)

    await ensure_topic(kafka_bootstrap, to_topic)
    judge = JudgeClient(config, prompts, sources)
    metadata = {s: session_metadata(e) for s, e in events_of.items()}
    slots = asyncio.Semaphore(config.turn_concurrency)
    progress("judge", 0, report.turns)

    async def judged(turn: Turn) -> Judgement:
        async with slots:
            outcome = await judge.judge(turn, metadata=metadata.get(turn.session_id))
        report.judge_errors += len(outcome.errors)
        progress("judge", 1, None)
        return outcome.judgement

    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        judgements = await asyncio.gather(
            *(judged(t) for session_turns in turns.values() for t in session_turns)
        )
        of_session: dict[str, list[Judgement]] = defaultdict(list)
        for j in judgements:
            of_session[j.session_id].append(j)
        for session_id, session_judgements in of_session.items():
            for draft in assemble_session(
                session_judgements, events_of[session_id], config, to_topic
            ):
                if not draft.has_signal:
                    report.no_signal += 1
                    continue
                sample = draft.sample.model_copy(
                    update={"released_at_version": max(released_at, draft.sample.weight_version)}
                )
                await publish(producer, to_topic, sample.session_id, sample)
                report.samples += 1
                report.by_source[sample.reward_source] = (
                    report.by_source.get(sample.reward_source, 0) + 1
                )
    finally:
        await producer.stop()
        await judge.aclose()
    return report


async def ensure_topic(bootstrap: str, topic: str) -> None:
    """The target topic, created like claw.samples (its spec in topics/) when missing."""
    spec = next(s for s in load_specs() if s.value == "Sample")
    replayed = spec.model_copy(update={"name": topic, "description": f"replay of {spec.name}"})
    await apply_topics(bootstrap, [replayed])
