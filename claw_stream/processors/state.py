"""The worker's state in Postgres: the archive, each session's stitch state, the sample outbox.

A Faust table lost its newest updates when its worker was SIGKILLed on Tansu, and Tansu has no
transactions; so what must survive a crash lives here. Every write is an idempotent upsert
keyed by an event id, and a session is only touched under its advisory lock, so the stitch
agent, the assemble agent and every worker's sweeper can race without harm.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    Integer,
    String,
    Text,
    bindparam,
    case,
    cast,
    delete,
    func,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from claw_stream.events import (
    Judgement,
    Sample,
    SessionEvent,
    Step,
    Turn,
    decode_event,
)
from claw_stream.processors.assemble import Draft
from claw_stream.processors.reward_sources import session_metadata as merged_metadata
from claw_stream.processors.rewards import is_stale
from claw_stream.processors.step_cache import StepCache
from claw_stream.store import models as m
from claw_stream.store.locks import lock_sessions


def _payload(event: Any) -> dict[str, Any]:
    return event.model_dump(mode="json")


def _json(event: Any) -> str:
    """An event as the JSON text that `_jsonb` binds."""
    return str(event.model_dump_json())


def _jsonb() -> Any:
    """The `payload` of an insert bound as text (`payload_json`, from `_json`) and cast by
    Postgres: pydantic writes the JSON itself, where `_payload` built dicts that SQLAlchemy then
    serialised in Python (together ~6% of the worker's CPU in bench/pipeline_bench.py)."""
    return cast(bindparam("payload_json", type_=Text), JSONB)


def _text(column: Any) -> Any:
    """A JSONB column read as text, which the event model parses once (read as JSON, asyncpg
    parsed it into dicts that `_decode` serialised again for the model: ~15% of the worker's
    CPU in bench/pipeline_bench.py)."""
    return cast(column, Text)


def _decode(model: type, payload: Any) -> Any:
    raw = payload if isinstance(payload, str | bytes) else json.dumps(payload)
    return decode_event(model, raw)


@dataclass(frozen=True)
class Gate:
    """Where the policy stands: the newest ready version and whether an update is open."""

    version: int
    updating: bool


@dataclass
class SessionView:
    """The open segment of a session as the stitcher sees it: its steps (with their turn types
    as classified) plus the tail an earlier segment left open, and where they stand."""

    steps: list[Step]
    arrived_at: dict[uuid.UUID, datetime]
    emitted: set[uuid.UUID]
    last_step_at: datetime | None
    end_reason: str | None
    end_n_steps: int | None
    end_requested_at: datetime | None
    closed_at: datetime | None
    segment: int = 0
    n_steps: int = 0  # steps placed in the session, all segments
    settled_through: int = -1  # the highest turn index of the earlier segments
    segments: dict[uuid.UUID, int] = field(default_factory=dict)
    tail: uuid.UUID | None = None  # an earlier segment's last main step, still without a turn
    tail_segment: int | None = None
    drifts: dict[uuid.UUID, str] = field(default_factory=dict)  # steps' token drift, found


async def lock_session(conn: AsyncConnection, session_id: str) -> None:
    await lock_sessions(conn, [session_id])


# --- archive --------------------------------------------------------------------------------


async def archive_step(conn: AsyncConnection, step: Step) -> bool:
    """Store a step (metadata + full payload); False when it was there already."""
    return bool(await archive_steps(conn, [step]))


async def archive_steps(
    conn: AsyncConnection, steps: list[Step], cache: StepCache | None = None
) -> set[uuid.UUID]:
    """Store steps, four statements however many (each a multi-row insert); the ids of those
    that were not there already (which `cache` then holds: what is archived is what it holds)."""
    unique = list({s.step_id: s for s in steps}.values())
    if not unique:
        return set()
    payloads = [_json(s) for s in unique]
    rows = [
        {"step_id": s.step_id, "session_id": s.session_id, "payload_json": payload}
        for s, payload in zip(unique, payloads, strict=True)
    ]
    inserted = await conn.execute(
        insert(m.StepPayload)
        .values(payload=_jsonb())
        .on_conflict_do_nothing()
        .returning(m.StepPayload.step_id),
        rows,
    )
    new = {step_id for (step_id,) in inserted}
    if cache is not None:
        for step, payload in zip(unique, payloads, strict=True):
            if step.step_id in new:
                cache.put(step, len(payload))
    await conn.execute(insert(m.Step).on_conflict_do_nothing(), [_step_row(s) for s in unique])
    # a session that did not come through a gateway (a replayed or foreign topic) gets its row
    groups: dict[str, str | None] = {}
    for s in unique:
        groups.setdefault(s.session_id, s.group_id)
    await conn.execute(
        insert(m.Session).values(status="active").on_conflict_do_nothing(),
        [{"session_id": sid, "group_id": group} for sid, group in groups.items()],
    )
    statement = insert(m.PipelineSession).values(last_step_at=func.now())
    await conn.execute(
        statement.on_conflict_do_update(
            index_elements=["session_id"], set_={"last_step_at": func.now()}
        ),
        [{"session_id": sid} for sid in groups],
    )
    return new


def _step_row(step: Step) -> dict[str, Any]:
    return {
        "step_id": step.step_id,
        "session_id": step.session_id,
        "group_id": step.group_id,
        "turn_type": step.turn_type,
        "turn_index": step.turn_index,
        "model": step.request.model,
        "engine": step.engine,
        "weight_version": step.weight_version,
        "finish_reason": step.response.finish_reason,
        "n_tool_calls": len(step.response.message.tool_calls or []),
        "prompt_tokens": step.usage.prompt_tokens,
        "completion_tokens": step.usage.completion_tokens,
        "latency_ms": step.latency_ms,
        "train": step.train,
        "created_at": step.created_at,
    }


async def current_segment(conn: AsyncConnection, session_id: str) -> tuple[int, bool]:
    """(the session's segment, whether it is closed); (0, False) for a session not seen yet."""
    return (await current_segments(conn, [session_id])).get(session_id, (0, False))


async def current_segments(
    conn: AsyncConnection, session_ids: list[str]
) -> dict[str, tuple[int, bool]]:
    """`current_segment` of each of these sessions that was seen already."""
    rows = await conn.execute(
        select(
            m.PipelineSession.session_id, m.PipelineSession.segment, m.PipelineSession.closed_at
        ).where(m.PipelineSession.session_id.in_(session_ids))
    )
    return {r.session_id: (r.segment, r.closed_at is not None) for r in rows}


def end_values(event: SessionEvent) -> dict[str, Any]:
    """What an end or refresh asks of its session (the first end wins)."""
    reason = "refreshed" if event.kind == "refreshed" else (event.reason or "ended")[:16]
    return {"end_reason": reason, "end_n_steps": event.n_steps}


async def archive_event(conn: AsyncConnection, event: SessionEvent) -> bool:
    """Store a session event in the segment open when it arrived (a reward or thumbs after a
    close belongs to the closed segment until a step opens the next). An end aimed at a
    segment that already closed (the gateway's own idle end, long after the worker's) ends
    nothing: the next step opens a new segment all the same."""
    segment, closed = await current_segment(conn, event.session_id)
    return bool(await archive_events(conn, [(event, segment, closed)]))


async def archive_events(
    conn: AsyncConnection, events: list[tuple[SessionEvent, int, bool]]
) -> set[uuid.UUID]:
    """`archive_event` for many events, each with its session's (segment, closed) as it stood
    when the event came; the ids of those that were not there already."""
    if not events:
        return set()
    rows = {
        event.event_id: {
            "event_id": event.event_id,
            "session_id": event.session_id,
            "kind": event.kind,
            "step_id": event.step_id,
            "reward": event.reward,
            "score": event.score,
            "text": event.text,
            "reason": event.reason,
            "payload": _payload(event),
            "created_at": event.created_at,
            "segment": segment,
        }
        for event, segment, _ in events
    }
    inserted = await conn.execute(
        insert(m.SessionEventRow).on_conflict_do_nothing().returning(m.SessionEventRow.event_id),
        list(rows.values()),
    )
    new = {event_id for (event_id,) in inserted}
    ends: dict[str, dict[str, Any]] = {}
    for event, _, closed in events:
        if event.kind in ("ended", "refreshed") and not closed:
            ends.setdefault(event.session_id, {"session_id": event.session_id, **end_values(event)})
    if ends:
        statement = insert(m.PipelineSession).values(end_requested_at=func.now())
        table = m.PipelineSession.__table__
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=["session_id"],
                set_={
                    k: func.coalesce(table.c[k], statement.excluded[k])
                    for k in ("end_reason", "end_n_steps", "end_requested_at")
                },  # the first end wins
            ),
            list(ends.values()),
        )
    rewards = [
        {"s": e.session_id, "r": e.reward}
        for e, _, _ in events
        if e.kind == "reward" and e.step_id is None
    ]
    if rewards:
        await conn.execute(
            update(m.Session)
            .where(m.Session.session_id == bindparam("s"))
            .values(episode_reward=bindparam("r")),
            rewards,
        )
    return new


async def record_turns(conn: AsyncConnection, turns: list[Turn]) -> None:
    if not turns:
        return
    await conn.execute(
        insert(m.Turn).on_conflict_do_nothing(),
        [
            {
                "turn_id": turn.turn_id,
                "session_id": turn.session_id,
                "step_id": turn.step.step_id,
                "turn_index": turn.step.turn_index,
                "next_step_id": turn.next_step_id,
                "has_next_state": turn.next_state is not None,
                "closed_reason": turn.closed_reason,
                "is_last": turn.is_last,
                "segment": turn.segment or 0,
                "token_drift": turn.token_drift,
            }
            for turn in turns
        ],
    )


async def archive_judgement(conn: AsyncConnection, judgement: Judgement) -> bool:
    """Store a judgement; the first one of a turn wins (a re-judged turn keeps its first)."""
    inserted = await conn.execute(
        insert(m.Judgement).values(payload=_jsonb()).on_conflict_do_nothing(),
        _judgement_row(judgement),
    )
    return bool(inserted.rowcount)


def _judgement_row(judgement: Judgement, text: str | None = None) -> dict[str, Any]:
    return {
        "judgement_id": judgement.judgement_id,
        "turn_id": judgement.turn.turn_id,
        "session_id": judgement.session_id,
        "step_id": judgement.turn.step.step_id,
        "judge_model": judgement.judge_model,
        "prm_score": judgement.prm_score,
        "prm_votes": list(judgement.prm_votes),
        "hint": judgement.hint,
        "n_hint_votes": len(judgement.hint_votes),
        "has_teacher": judgement.teacher_logprobs is not None,
        "explicit_reward": judgement.explicit_reward,
        "feedback_score": judgement.feedback_score,
        "payload_json": text if text is not None else _json(judgement),
        "segment": judgement.turn.segment or 0,
        "history_cut": judgement.history_cut or 0,
    }


async def archive_judgements(
    conn: AsyncConnection,
    judgements: list[Judgement],
    texts: Mapping[uuid.UUID, str] | None = None,
) -> Known:
    """Store judgements in one statement; the first one of a turn wins. Those stored now, as
    they are stored (those that were there already may differ). `texts`: the JSON of some of
    them as `encode_event` wrote it, by judgement id (a judgement carries its whole step:
    encoding it again was ~4% of the worker's CPU in bench/pipeline_bench.py)."""
    texts = texts or {}
    if not judgements:
        return {}
    unique = {j.judgement_id: j for j in judgements}
    inserted = await conn.execute(
        insert(m.Judgement)
        .values(payload=_jsonb())
        .on_conflict_do_nothing()
        .returning(m.Judgement.judgement_id),
        [_judgement_row(j, texts.get(j.judgement_id)) for j in unique.values()],
    )
    return {judgement_id: unique[judgement_id] for (judgement_id,) in inserted}


async def turn_facts(conn: AsyncConnection, turns: list[Turn]) -> dict[uuid.UUID, list[str] | None]:
    """For turns about to be judged: None for one judged already, else its feedback texts;
    turns of sessions that have feedback text are left out (`feedback_texts` reads them)."""
    from claw_stream.processors.judge import judgement_id_of

    ids = {judgement_id_of(t): t.turn_id for t in turns}
    rows = await conn.execute(
        select(m.Judgement.judgement_id).where(m.Judgement.judgement_id.in_(list(ids)))
    )
    judged_ = {ids[j] for (j,) in rows}
    e = m.SessionEventRow
    rows = await conn.execute(
        select(e.session_id)
        .where(
            e.session_id.in_(sorted({t.session_id for t in turns})),
            e.kind == "feedback",
            e.text.is_not(None),
        )
        .distinct()
    )
    with_text = {s for (s,) in rows}
    out: dict[uuid.UUID, list[str] | None] = {}
    for t in turns:
        if t.turn_id in judged_:
            out[t.turn_id] = None
        elif t.session_id not in with_text:
            out[t.turn_id] = []
    return out


async def skip_judging(conn: AsyncConnection, judged_as: list[tuple[Turn, uuid.UUID]]) -> None:
    """Turns that must not be trained (their step or session switched off): each gets an
    empty judgement row, already sampled, so that its segment is assembled without it and a
    redelivered turn is not judged."""
    if not judged_as:
        return
    await conn.execute(
        insert(m.Judgement)
        .values(
            [
                {
                    "judgement_id": judgement_id,
                    "turn_id": turn.turn_id,
                    "session_id": turn.session_id,
                    "step_id": turn.step.step_id,
                    "judge_model": "",
                    "prm_votes": [],
                    "payload": null(),  # SQL NULL: None would be stored as JSON null
                    "segment": turn.segment or 0,
                    "sampled_at": func.now(),
                }
                for turn, judgement_id in judged_as
            ]
        )
        .on_conflict_do_nothing()
    )


async def judged(conn: AsyncConnection, judgement_id: uuid.UUID) -> bool:
    row = await conn.execute(
        select(m.Judgement.judgement_id).where(m.Judgement.judgement_id == judgement_id)
    )
    return row.first() is not None


# --- turns the judge could not answer yet --------------------------------------------------


@dataclass(frozen=True)
class Deferred:
    attempts: int
    waited_s: float  # since the judge first failed on this turn


async def defer_judging(
    conn: AsyncConnection, turn: Turn, error: str, delay_s: Callable[[int], float]
) -> Deferred:
    """Keep a turn the judge could not answer, to be judged again after `delay_s(attempts)`."""
    row = (
        await conn.execute(
            insert(m.JudgeRetry)
            .values(
                turn_id=turn.turn_id,
                session_id=turn.session_id,
                payload=_jsonb(),
                attempts=1,
                last_error=error,
            )
            .on_conflict_do_update(
                index_elements=[m.JudgeRetry.turn_id],
                set_={"attempts": m.JudgeRetry.attempts + 1, "last_error": error},
            )
            .returning(
                m.JudgeRetry.attempts,
                func.extract("epoch", func.now() - m.JudgeRetry.first_failed_at),
            ),
            {"payload_json": _json(turn)},
        )
    ).one()
    attempts, waited = int(row[0]), float(row[1])
    await conn.execute(
        update(m.JudgeRetry)
        .where(m.JudgeRetry.turn_id == turn.turn_id)
        .values(next_at=func.now() + timedelta(seconds=delay_s(attempts)))
    )
    return Deferred(attempts, waited)


async def give_up_judging(conn: AsyncConnection, turn_id: uuid.UUID) -> None:
    await conn.execute(
        update(m.JudgeRetry).where(m.JudgeRetry.turn_id == turn_id).values(gave_up_at=func.now())
    )


async def judging_due(conn: AsyncConnection, lease_s: float, limit: int) -> list[Turn]:
    """Deferred turns whose time has come, leased for `lease_s` (another worker's sweeper
    skips them meanwhile; a worker that dies mid-judging leaves them due again after it)."""
    rows = await conn.execute(
        select(m.JudgeRetry.turn_id, _text(m.JudgeRetry.payload))
        .where(m.JudgeRetry.gave_up_at.is_(None), m.JudgeRetry.next_at <= func.now())
        .order_by(m.JudgeRetry.next_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    due = rows.all()
    if not due:
        return []
    await conn.execute(
        update(m.JudgeRetry)
        .where(m.JudgeRetry.turn_id.in_([r[0] for r in due]))
        .values(next_at=func.now() + timedelta(seconds=lease_s))
    )
    return [_decode(Turn, r[1]) for r in due]


async def judged_again(conn: AsyncConnection, turn_id: uuid.UUID) -> None:
    """A kept turn judged at last (one that gave up stays, for `doctor` to show)."""
    await conn.execute(
        delete(m.JudgeRetry).where(
            m.JudgeRetry.turn_id == turn_id, m.JudgeRetry.gave_up_at.is_(None)
        )
    )


async def judging_waiting(conn: AsyncConnection) -> int:
    row = await conn.execute(
        select(func.count()).select_from(m.JudgeRetry).where(m.JudgeRetry.gave_up_at.is_(None))
    )
    return int(row.scalar() or 0)


# --- sessions -------------------------------------------------------------------------------


async def place_step(conn: AsyncConnection, step: Step) -> tuple[int, bool] | None:
    """Put a new step into the session's open segment, opening the next one when the last
    closed: (segment, opened). None when the step was placed before (a redelivery)."""
    row = (
        await conn.execute(
            text(
                "SELECT (SELECT segment FROM pipeline_steps WHERE step_id = :step) AS placed,"
                " segment, closed_at IS NOT NULL AS closed, n_steps"
                " FROM pipeline_sessions WHERE session_id = :s"
            ),
            {"step": step.step_id, "s": step.session_id},
        )
    ).first()
    if row is not None and row.placed is not None:
        return None
    segment, closed = (row.segment, row.closed) if row is not None else (0, False)
    if closed:  # the conversation goes on after an end or an idle close: a new episode
        segment += 1
        await conn.execute(
            update(m.PipelineSession)
            .where(m.PipelineSession.session_id == step.session_id)
            .values(
                segment=segment,
                closed_at=None,
                end_reason=None,
                end_n_steps=None,
                end_requested_at=None,
                assembled_at=None,
                n_samples=None,
            )
        )
    if closed or row is None or row.n_steps == 0:
        await open_segments(conn, [(step.session_id, segment)])
    return segment, closed


async def record_placement(
    conn: AsyncConnection, step: Step, segment: int, turn_type: str, classified_by: str
) -> None:
    await record_placements(conn, [(step, segment, turn_type, classified_by)])


Placement = tuple[Step, int, str, str]  # a step, its segment, its turn type and why


async def record_placements(conn: AsyncConnection, placements: list[Placement]) -> None:
    """Where each step went (once) and one more step counted in its session: one statement
    per step, sent together."""
    if not placements:
        return
    await conn.execute(
        text(
            "WITH placed AS (INSERT INTO pipeline_steps (step_id, session_id, segment,"
            " turn_index, turn_type, classified_by, step_created_at)"
            " VALUES (:step, :s, :g, :i, :t, :why, :at) ON CONFLICT DO NOTHING RETURNING 1)"
            " UPDATE pipeline_sessions SET n_steps = n_steps + (SELECT count(*) FROM placed)"
            " WHERE session_id = :s"
        ),
        [
            {
                "step": step.step_id,
                "s": step.session_id,
                "g": segment,
                "i": step.turn_index,
                "t": turn_type,
                "why": classified_by,
                "at": step.created_at,
            }
            for step, segment, turn_type, classified_by in placements
        ],
    )


async def placed_steps(conn: AsyncConnection, step_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Those of these steps that were placed already (redeliveries)."""
    if not step_ids:
        return set()
    rows = await conn.execute(
        select(m.PipelineStep.step_id).where(m.PipelineStep.step_id.in_(step_ids))
    )
    return {step_id for (step_id,) in rows}


async def open_segments(conn: AsyncConnection, pairs: list[tuple[str, int]]) -> None:
    if pairs:
        await conn.execute(
            insert(m.PipelineSegment).on_conflict_do_nothing(),
            [{"session_id": s, "segment": g} for s, g in pairs],
        )


async def session_view(
    conn: AsyncConnection, session_id: str, cache: StepCache | None = None
) -> SessionView | None:
    return (await session_views(conn, [session_id], cache)).get(session_id)


async def session_views(
    conn: AsyncConnection, session_ids: list[str], cache: StepCache | None = None
) -> dict[str, SessionView]:
    """The views of these sessions (those seen already), in three statements however many
    (and one more per resumed session). Steps that `cache` holds are not sent again nor
    decoded; those read are put in it."""
    rows = {
        row.session_id: row
        for row in await conn.execute(
            select(m.PipelineSession.__table__).where(m.PipelineSession.session_id.in_(session_ids))
        )
    }
    if not rows:
        return {}
    earlier: dict[str, Any] = {}
    for session_id, row in rows.items():
        if row.segment > 0:  # what the earlier segments left: an open tail, their turn indexes
            earlier[session_id] = (
                await conn.execute(
                    text(
                        "SELECT g.tail_step_id, g.segment,"
                        " (SELECT max(turn_index) FROM pipeline_steps"
                        "   WHERE session_id = :s AND segment < :g) AS settled"
                        " FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT tail_step_id, segment"
                        "   FROM pipeline_segments WHERE session_id = :s AND segment < :g"
                        "   AND tail_step_id IS NOT NULL ORDER BY segment DESC LIMIT 1) g ON true"
                    ),
                    {"s": session_id, "g": row.segment},
                )
            ).one()
    tails = [e.tail_step_id for e in earlier.values() if e.tail_step_id is not None]
    ps = m.PipelineStep
    current = (
        select(
            func.unnest(bindparam("s", type_=ARRAY(String))).label("s"),
            func.unnest(bindparam("g", type_=ARRAY(Integer))).label("g"),
        )
    ).subquery()
    held = cache.held(rows) if cache is not None else {}
    cached = bindparam("cached", type_=ARRAY(UUID(as_uuid=True)))
    payloads = await conn.execute(
        select(
            ps.session_id,
            ps.step_id,
            case((ps.step_id == func.any(cached), null()), else_=_text(m.StepPayload.payload)),
            ps.created_at,
            ps.turn_type,
            ps.segment,
            ps.token_drift,
        )
        .join(m.StepPayload, m.StepPayload.step_id == ps.step_id)
        .join(current, current.c.s == ps.session_id)
        .where((ps.segment == current.c.g) | ps.step_id.in_(tails)),
        {"s": list(rows), "g": [row.segment for row in rows.values()], "cached": list(held)},
    )
    views: dict[str, SessionView] = {}
    for session_id, row in rows.items():
        before = earlier.get(session_id)
        settled = before.settled if before is not None else None
        views[session_id] = SessionView(
            steps=[],
            arrived_at={},
            emitted=set(),
            last_step_at=row.last_step_at,
            end_reason=row.end_reason,
            end_n_steps=row.end_n_steps,
            end_requested_at=row.end_requested_at,
            closed_at=row.closed_at,
            segment=row.segment,
            n_steps=row.n_steps,
            settled_through=settled if settled is not None else -1,
            tail=before.tail_step_id if before is not None else None,
            tail_segment=before.segment if before is not None else None,
        )
    hits = misses = 0
    for session_id, step_id, payload, created_at, turn_type, step_segment, drift in payloads:
        view = views[session_id]
        if payload is None:
            step = held[step_id]
            hits += 1
        else:
            step = _decode(Step, payload)
            misses += 1
            if cache is not None:
                cache.put(step, len(payload))
        if step.turn_type != turn_type:
            step = step.model_copy(update={"turn_type": turn_type})
        view.steps.append(step)
        view.arrived_at[step.step_id] = created_at
        view.segments[step.step_id] = step_segment
        if drift is not None:
            view.drifts[step.step_id] = drift
    step_ids = [step_id for view in views.values() for step_id in view.segments]
    if step_ids:
        emitted = await conn.execute(
            select(m.Turn.session_id, m.Turn.turn_id).where(m.Turn.step_id.in_(step_ids))
        )
        for session_id, turn_id in emitted:
            if session_id in views:
                views[session_id].emitted.add(turn_id)
    if cache is not None:
        cache.count(hits, misses)
    return views


async def clear_tail(conn: AsyncConnection, session_id: str, segment: int) -> None:
    await conn.execute(
        update(m.PipelineSegment)
        .where(m.PipelineSegment.session_id == session_id, m.PipelineSegment.segment == segment)
        .values(tail_step_id=None)
    )


async def close_segment(
    conn: AsyncConnection, session_id: str, segment: int, reason: str, tail: uuid.UUID | None
) -> None:
    await close_segments(conn, [(session_id, segment, reason, tail)])


async def close_segments(
    conn: AsyncConnection, closes: list[tuple[str, int, str, uuid.UUID | None]]
) -> None:
    """Close these (session, segment)s, each with its reason and the tail it keeps open."""
    if not closes:
        return
    await conn.execute(
        update(m.PipelineSession)
        .where(m.PipelineSession.session_id == bindparam("s"))
        .values(closed_at=func.now()),
        [{"s": s} for s, _, _, _ in closes],
    )
    g = m.PipelineSegment
    await conn.execute(
        update(g)
        .where(g.session_id == bindparam("s"), g.segment == bindparam("g"))
        .values(closed_at=func.now(), close_reason=bindparam("why"), tail_step_id=bindparam("t")),
        [{"s": s, "g": seg, "why": why[:16], "t": tail} for s, seg, why, tail in closes],
    )


@dataclass
class StitchWrites:
    """What stitching writes, for one session or many: the new turns (published before they
    are written), the turns not to judge, the tails taken up and the segments closed."""

    turns: list[Turn] = field(default_factory=list)
    skipped: list[tuple[Turn, uuid.UUID]] = field(default_factory=list)
    tails_cleared: list[tuple[str, int]] = field(default_factory=list)
    closes: list[tuple[str, int, str, uuid.UUID | None]] = field(default_factory=list)
    drifts: dict[uuid.UUID, str] = field(default_factory=dict)  # token drift found, by step


async def write_stitched(conn: AsyncConnection, w: StitchWrites) -> None:
    if w.drifts:
        await conn.execute(
            update(m.PipelineStep)
            .where(m.PipelineStep.step_id == bindparam("id"))
            .values(token_drift=bindparam("drift")),
            [{"id": step_id, "drift": drift} for step_id, drift in w.drifts.items()],
        )
    await record_turns(conn, w.turns)
    await skip_judging(conn, w.skipped)
    for session_id, segment in w.tails_cleared:
        await clear_tail(conn, session_id, segment)
    await close_segments(conn, w.closes)


async def mark_closed(conn: AsyncConnection, session_id: str) -> None:
    await conn.execute(
        update(m.PipelineSession)
        .where(m.PipelineSession.session_id == session_id)
        .values(closed_at=func.now())
    )


async def sessions_to_sweep(
    conn: AsyncConnection, idle_s: float, grace_s: float, limit: int = 200
) -> list[str]:
    """Open sessions due to close by time: an end that waited `grace_s` for missing steps, or
    no step for `idle_s`. Arrivals (a step, the end itself) close the others."""
    now = datetime.now(UTC)
    table = m.PipelineSession
    rows = await conn.execute(
        select(table.session_id)
        .where(
            table.closed_at.is_(None),
            (table.end_requested_at < now - timedelta(seconds=grace_s))
            | (table.last_step_at < now - timedelta(seconds=idle_s)),
        )
        .limit(limit)
    )
    return [r for (r,) in rows]


async def tails_due(conn: AsyncConnection, tail_timeout_s: float, limit: int = 200) -> list[str]:
    """Sessions whose idle-closed segment kept its last step open longer than the timeout."""
    cutoff = datetime.now(UTC) - timedelta(seconds=tail_timeout_s)
    g = m.PipelineSegment
    rows = await conn.execute(
        select(g.session_id)
        .where(g.tail_step_id.is_not(None), g.closed_at < cutoff)
        .distinct()
        .limit(limit)
    )
    return [r for (r,) in rows]


# --- samples: the outbox --------------------------------------------------------------------


async def gate(conn: AsyncConnection, policy: str, update_timeout_s: float) -> Gate:
    row = (
        await conn.execute(
            text(
                "SELECT COALESCE((SELECT version FROM weight_versions WHERE policy = :p"
                "   AND ready_at IS NOT NULL ORDER BY ready_at DESC, version DESC LIMIT 1), 0)"
                "   AS ready,"
                " MAX(version) FILTER (WHERE status = 'updating'"
                "   AND updating_at > now() - make_interval(secs => :t)) AS updating"
                " FROM weight_versions WHERE policy = :p"
            ),
            {"p": policy, "t": update_timeout_s},
        )
    ).one()
    return Gate(int(row.ready), row.updating is not None and row.updating > row.ready)


def release_status(sample: Sample, signal: bool, g: Gate, max_staleness: int) -> str:
    if not signal:
        return "no_signal"
    if g.updating:
        return "held"
    if is_stale(sample.weight_version, g.version, max_staleness):
        return "dropped"
    return "pending"


def released(sample: Sample, g: Gate) -> Sample:
    return sample.model_copy(update={"released_at_version": max(g.version, sample.weight_version)})


Pair = tuple[str, int]  # (session id, segment)
# judgements a caller has just stored, by id: read back, each cost a JSON decode (with the
# judgements' own decode, ~20% of the worker's CPU in bench/pipeline_bench.py)
Known = dict[uuid.UUID, Judgement]


def _sessions_filter(column: str, sessions: list[str] | None) -> str:
    return "" if sessions is None else f" AND {column} = ANY(:sessions)"


async def due_judgements(
    conn: AsyncConnection,
    sessions: list[str] | None,
    grace_s: float,
    limit: int = 2000,
    known: Known | None = None,
) -> list[Judgement]:
    """per_turn: judgements (of these sessions, or any) whose own sample is not assembled yet
    and whose thumbs / explicit reward had `grace_s` to arrive; locked, so that two workers'
    release passes take different ones. Those in `known` are not read back."""
    known = known or {}
    rows = await conn.execute(
        text(
            "SELECT judgement_id, CASE WHEN judgement_id = ANY(CAST(:known AS uuid[])) THEN NULL"
            " ELSE payload::text END FROM judgements WHERE sampled_at IS NULL"
            " AND payload IS NOT NULL AND created_at <= now() - make_interval(secs => :grace)"
            + _sessions_filter("session_id", sessions)
            + " ORDER BY created_at LIMIT :limit FOR UPDATE SKIP LOCKED"
        ),
        {
            "known": list(known),
            "grace": grace_s,
            "limit": limit,
            **({"sessions": sessions} if sessions else {}),
        },
    )
    return [_judgement(judgement_id, p, known) for judgement_id, p in rows]


def _judgement(judgement_id: uuid.UUID, payload: str | None, known: Known) -> Judgement:
    return known[judgement_id] if payload is None else _decode(Judgement, payload)


async def segment_signals(
    conn: AsyncConnection, pairs: set[Pair]
) -> tuple[dict[Pair, list[SessionEvent]], dict[Pair, list[tuple[uuid.UUID, datetime]]]]:
    """Each segment's reward and feedback events and its main steps (id, creation time)."""
    events: dict[Pair, list[SessionEvent]] = {k: [] for k in pairs}
    steps: dict[Pair, list[tuple[uuid.UUID, datetime]]] = {k: [] for k in pairs}
    if not pairs:
        return events, steps
    sessions = sorted({s for s, _ in pairs})
    rows = await conn.execute(
        text(
            "SELECT session_id, segment, payload::text FROM session_events"
            " WHERE session_id = ANY(:sessions) AND kind IN ('reward', 'feedback')"
        ),
        {"sessions": sessions},
    )
    for session_id, segment, payload in rows:
        if (session_id, segment) in events:
            events[(session_id, segment)].append(_decode(SessionEvent, payload))
    rows = await conn.execute(
        text(
            "SELECT session_id, segment, step_id, step_created_at FROM pipeline_steps"
            " WHERE session_id = ANY(:sessions) AND turn_type = 'main'"
        ),
        {"sessions": sessions},
    )
    for session_id, segment, step_id, created_at in rows:
        if (session_id, segment) in steps:
            steps[(session_id, segment)].append((step_id, created_at))
    return events, steps


async def segments_to_assemble(
    conn: AsyncConnection,
    sessions: list[str] | None,
    late: list[Pair] | None = None,
    per_turn: bool = True,
    limit: int = 500,
) -> list[Pair]:
    """Closed segments with no open tail, every turn judged and every judgement's own sample
    assembled, not assembled yet (or in `late`: an episode reward came after they were)."""
    late = late or []
    rows = await conn.execute(
        text(
            "SELECT g.session_id, g.segment FROM pipeline_segments g"
            " WHERE g.closed_at IS NOT NULL AND g.tail_step_id IS NULL"
            + _sessions_filter("g.session_id", sessions)
            + " AND (g.assembled_at IS NULL OR (g.session_id, g.segment) IN"
            "   (SELECT * FROM unnest(CAST(:late_s AS text[]), CAST(:late_g AS int[]))))"
            " AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = g.session_id"
            "   AND t.segment = g.segment AND NOT EXISTS"
            "   (SELECT 1 FROM judgements j WHERE j.turn_id = t.turn_id))"
            " AND (NOT :per_turn OR NOT EXISTS (SELECT 1 FROM judgements j"
            "   WHERE j.session_id = g.session_id AND j.segment = g.segment"
            "   AND j.sampled_at IS NULL))"
            " LIMIT :limit"
        ),
        {
            "late_s": [s for s, _ in late],
            "late_g": [g for _, g in late],
            "limit": limit,
            "per_turn": per_turn,
            **({"sessions": sessions} if sessions else {}),
        },
    )
    return [(r.session_id, r.segment) for r in rows]


async def segment_judgements(
    conn: AsyncConnection, pairs: list[Pair], known: Known | None = None
) -> dict[Pair, list[Judgement]]:
    """The first judgement of each turn of these segments (those in `known` not read back)."""
    out: dict[Pair, list[Judgement]] = {p: [] for p in pairs}
    if not pairs:
        return out
    known = known or {}
    rows = await conn.execute(
        text(
            "SELECT DISTINCT ON (t.turn_id) t.session_id, t.segment, j.judgement_id,"
            " CASE WHEN j.judgement_id = ANY(CAST(:known AS uuid[])) THEN NULL"
            " ELSE j.payload::text END FROM turns t"
            " JOIN judgements j ON j.turn_id = t.turn_id"
            " WHERE t.session_id = ANY(:sessions) AND j.payload IS NOT NULL"
            " ORDER BY t.turn_id, j.created_at"
        ),
        {"sessions": sorted({s for s, _ in pairs}), "known": list(known)},
    )
    for session_id, segment, judgement_id, payload in rows:
        if (session_id, segment) in out:
            out[(session_id, segment)].append(_judgement(judgement_id, payload, known))
    return out


async def mark_sampled(conn: AsyncConnection, judgement_ids: list[uuid.UUID]) -> None:
    if judgement_ids:
        await conn.execute(
            update(m.Judgement)
            .where(m.Judgement.judgement_id.in_(judgement_ids), m.Judgement.sampled_at.is_(None))
            .values(sampled_at=func.now())
        )


async def signal_counts(conn: AsyncConnection, pairs: list[Pair]) -> dict[Pair, int]:
    """How many samples with a learning signal (not 'no_signal') each segment has."""
    out = dict.fromkeys(pairs, 0)
    if not pairs:
        return out
    rows = await conn.execute(
        text(
            "SELECT t.session_id, t.segment, count(*) FROM samples x"
            " JOIN turns t ON t.turn_id = x.turn_id"
            " WHERE t.session_id = ANY(:sessions) AND x.status <> 'no_signal'"
            " GROUP BY t.session_id, t.segment"
        ),
        {"sessions": sorted({s for s, _ in pairs})},
    )
    for session_id, segment, n in rows:
        if (session_id, segment) in out:
            out[(session_id, segment)] = int(n)
    return out


async def mark_assembled(conn: AsyncConnection, counts: dict[Pair, int]) -> None:
    if not counts:
        return
    values = {
        "s": [s for s, _ in counts],
        "g": [g for _, g in counts],
        "n": list(counts.values()),
    }
    for table in ("pipeline_segments", "pipeline_sessions"):
        await conn.execute(
            text(
                f"UPDATE {table} x SET assembled_at = coalesce(x.assembled_at, now()),"
                " n_samples = v.n FROM unnest(CAST(:s AS text[]), CAST(:g AS int[]),"
                " CAST(:n AS int[])) AS v(s, g, n) WHERE x.session_id = v.s AND x.segment = v.g"
            ),
            values,
        )


async def promote_last(
    conn: AsyncConnection, pair: Pair, g: Gate, max_staleness: int
) -> tuple[list[Sample], str | None]:
    """per_turn's at-least-one rule: a segment none of whose samples has a signal sends its last
    turn's sample all the same. (samples to publish, the status it took)."""
    row = (
        await conn.execute(
            text(
                "SELECT x.sample_id, x.payload::text AS payload FROM samples x"
                " JOIN turns t ON t.turn_id = x.turn_id"
                " WHERE t.session_id = :s AND t.segment = :g AND x.status = 'no_signal'"
                " ORDER BY t.turn_index DESC, x.created_at DESC LIMIT 1"
            ),
            {"s": pair[0], "g": pair[1]},
        )
    ).first()
    if row is None:
        return [], None
    sample = _decode(Sample, row.payload)
    status = release_status(sample, True, g, max_staleness)
    if status == "pending":
        sample = released(sample, g)
    await conn.execute(
        update(m.Sample)
        .where(m.Sample.sample_id == row.sample_id)
        .values(
            status=status,
            payload=_payload(sample),
            released_at_version=sample.released_at_version,
            updated_at=func.now(),
        )
    )
    return ([sample] if status == "pending" else []), status


async def due_tails(
    conn: AsyncConnection, session_id: str, tail_timeout_s: float
) -> list[tuple[int, Step]]:
    """The session's segments whose tail waited `tail_timeout_s`, with the tail step."""
    g = m.PipelineSegment
    rows = await conn.execute(
        select(g.segment, _text(m.StepPayload.payload))
        .join(m.StepPayload, m.StepPayload.step_id == g.tail_step_id)
        .where(
            g.session_id == session_id,
            g.tail_step_id.is_not(None),
            g.closed_at < datetime.now(UTC) - timedelta(seconds=tail_timeout_s),
        )
    )
    out = []
    for segment, payload in rows:
        step = _decode(Step, payload)
        out.append((segment, step.model_copy(update={"turn_type": "main"})))
    return out


async def session_metadata(conn: AsyncConnection, session_id: str) -> dict[str, Any]:
    """What the client passed about the session (`/rl/start_session` and `/rl/set_reward`
    metadata, later keys winning): reward sources read a task's ground truth there."""
    e = m.SessionEventRow
    rows = await conn.execute(
        select(_text(e.payload)).where(
            e.session_id == session_id,
            e.kind.in_(("started", "reward")),
        )
    )
    return merged_metadata(_decode(SessionEvent, p) for (p,) in rows)


async def feedback_texts(conn: AsyncConnection, turn: Turn) -> list[str]:
    """What the user wrote about this turn's answer (`/rl/feedback` text): aimed at its step, or
    aimed at no step and sent after the answer and before the next main step."""
    step = turn.step
    e = m.SessionEventRow
    rows = await conn.execute(
        select(e.step_id, e.text, e.created_at)
        .where(e.session_id == turn.session_id, e.kind == "feedback", e.text.is_not(None))
        .order_by(e.created_at)
    )
    found = rows.all()
    if not found:
        return []
    next_at = None
    if turn.next_step_id is not None:
        next_at = await conn.scalar(
            select(m.PipelineStep.step_created_at).where(
                m.PipelineStep.step_id == turn.next_step_id
            )
        )
    out: list[str] = []
    for step_id, text_, created_at in found:
        if step_id == step.step_id or (
            step_id is None
            and created_at >= step.created_at
            and (next_at is None or created_at < next_at)
        ):
            out.append(str(text_))
    return out


async def store_samples(
    conn: AsyncConnection,
    drafts: list[Draft],
    g: Gate,
    max_staleness: int,
    topic: str,
) -> tuple[list[Sample], dict[str, int]]:
    """Write samples with their release status, in one statement; returns those to publish now
    (a sample written before keeps its row and is not sent again)."""
    to_publish: list[Sample] = []
    counts: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    statuses: dict[uuid.UUID, tuple[str, Sample]] = {}
    for draft in drafts:
        status = release_status(draft.sample, draft.has_signal, g, max_staleness)
        sample = released(draft.sample, g) if status == "pending" else draft.sample
        if sample.sample_id in statuses:
            continue
        statuses[sample.sample_id] = (status, sample)
        rows.append(
            {
                "sample_id": sample.sample_id,
                "topic": topic,
                "session_id": sample.session_id,
                "group_id": sample.group_id,
                "step_id": sample.step_id,
                "turn_id": sample.turn_id,
                "method": sample.method,
                "reward": sample.reward,
                "reward_source": sample.reward_source,
                "weight_version": sample.weight_version,
                "released_at_version": sample.released_at_version,
                "n_prompt_tokens": len(sample.prompt_token_ids),
                "n_response_tokens": len(sample.response_token_ids),
                "status": status,
                "payload_json": _json(sample),
            }
        )
    if not rows:
        return [], {}
    inserted = await conn.execute(
        insert(m.Sample)
        .values(payload=_jsonb())
        .on_conflict_do_nothing()
        .returning(m.Sample.sample_id),
        rows,
    )
    for (sample_id,) in inserted:
        status, sample = statuses[sample_id]
        counts[status] = counts.get(status, 0) + 1
        if status == "pending":
            to_publish.append(sample)
    return to_publish, counts


async def release_held(
    conn: AsyncConnection, g: Gate, max_staleness: int, limit: int = 500
) -> tuple[list[Sample], int]:
    """Held samples once no update is open: stale ones dropped, the others made pending."""
    if g.updating:
        return [], 0
    rows = await conn.execute(
        select(m.Sample.sample_id, _text(m.Sample.payload))
        .where(m.Sample.status == "held")
        .order_by(m.Sample.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    out: list[Sample] = []
    dropped = 0
    for sample_id, payload in rows:
        sample = _decode(Sample, payload)
        status = release_status(sample, True, g, max_staleness)  # pending or dropped
        if status == "dropped":
            dropped += 1
        else:
            sample = released(sample, g)
            out.append(sample)
        await conn.execute(
            update(m.Sample)
            .where(m.Sample.sample_id == sample_id)
            .values(
                status=status,
                payload=_payload(sample),
                released_at_version=sample.released_at_version,
                updated_at=func.now(),
            )
        )
    return out, dropped


async def orphans(conn: AsyncConnection, older_than_s: float, limit: int = 500) -> list[Sample]:
    """Pending samples nobody marked published (their worker died between commit and ack)."""
    cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
    rows = await conn.execute(
        select(_text(m.Sample.payload))
        .where(m.Sample.status == "pending", m.Sample.updated_at < cutoff)
        .order_by(m.Sample.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    out = [_decode(Sample, p) for (p,) in rows]
    if out:  # claim them for a while, so two sweepers do not both resend
        await conn.execute(
            update(m.Sample)
            .where(m.Sample.sample_id.in_([s.sample_id for s in out]))
            .values(updated_at=func.now())
        )
    return out


async def untrained(conn: AsyncConnection, older_than_s: float, limit: int = 1000) -> list[Sample]:
    """Published samples no training step recorded (`trained_in_step`), published or last
    looked at more than `older_than_s` ago; claimed for another `older_than_s`."""
    cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
    rows = await conn.execute(
        select(_text(m.Sample.payload))
        .where(
            m.Sample.status == "published",
            m.Sample.trained_in_step.is_(None),
            m.Sample.updated_at < cutoff,
        )
        .order_by(m.Sample.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    out = [_decode(Sample, p) for (p,) in rows]
    if out:
        await conn.execute(
            update(m.Sample)
            .where(m.Sample.sample_id.in_([s.sample_id for s in out]))
            .values(updated_at=func.now())
        )
    return out


async def mark_published(engine: AsyncEngine, sample_ids: list[uuid.UUID]) -> None:
    if not sample_ids:
        return
    async with engine.begin() as conn:
        await conn.execute(
            update(m.Sample)
            .where(m.Sample.sample_id.in_(sample_ids), m.Sample.status == "pending")
            .values(status="published", updated_at=func.now())
        )
