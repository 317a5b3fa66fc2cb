"""Each session's stitch state: where its steps were placed, its open segment and tail, and what the sweeper closes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    Integer,
    String,
    bindparam,
    case,
    func,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import UUID, insert
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.events import SessionEvent, Step, Turn
from claw_stream.names import HELD_OUT
from claw_stream.store import models as m
from claw_stream.store.locks import lock_sessions
from claw_stream.worker.stages.step_cache import StepCache
from claw_stream.worker.state.archive import archive_events, record_turns, skip_judging
from claw_stream.worker.state.rows import as_text, decode


@dataclass
class StitchView:
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
) -> StitchView | None:
    return (await session_views(conn, [session_id], cache)).get(session_id)


async def session_views(
    conn: AsyncConnection, session_ids: list[str], cache: StepCache | None = None
) -> dict[str, StitchView]:
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
            case((ps.step_id == func.any(cached), null()), else_=as_text(m.StepPayload.payload)),
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
    views: dict[str, StitchView] = {}
    for session_id, row in rows.items():
        before = earlier.get(session_id)
        settled = before.settled if before is not None else None
        views[session_id] = StitchView(
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
            step = decode(Step, payload)
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
            select(m.TurnRow.session_id, m.TurnRow.turn_id).where(m.TurnRow.step_id.in_(step_ids))
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
    are written), the turns not to judge (switched off, or held out), the tails taken up and
    the segments closed."""

    turns: list[Turn] = field(default_factory=list)
    skipped: list[tuple[Turn, uuid.UUID]] = field(default_factory=list)
    held_out: list[tuple[Turn, uuid.UUID]] = field(default_factory=list)  # eval.holdout_share
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
    await skip_judging(conn, w.held_out, HELD_OUT)
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


async def archive_event(conn: AsyncConnection, event: SessionEvent) -> bool:
    """Store a session event in the segment open when it arrived (a reward or thumbs after a
    close belongs to the closed segment until a step opens the next). An end aimed at a
    segment that already closed (the gateway's own idle end, long after the worker's) ends
    nothing: the next step opens a new segment all the same."""
    segment, closed = await current_segment(conn, event.session_id)
    return bool(await archive_events(conn, [(event, segment, closed)]))
