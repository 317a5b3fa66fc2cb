"""The worker's state in Postgres: the archive, each session's stitch state, the sample outbox.

A Faust table lost its newest updates when its worker was SIGKILLed on Tansu, and Tansu has no
transactions; so what must survive a crash lives here. Every write is an idempotent upsert
keyed by an event id, and a session is only touched under its advisory lock, so the stitch
agent, the assemble agent and every worker's sweeper can race without harm.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from claw_stream.events import (
    Judgement,
    Sample,
    SessionEvent,
    Step,
    Turn,
    WeightEvent,
    decode_event,
)
from claw_stream.processors.assemble import Draft
from claw_stream.processors.rewards import is_stale
from claw_stream.store import models as m


def _payload(event: Any) -> dict[str, Any]:
    return event.model_dump(mode="json")


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
    steps: list[Step]
    arrived_at: dict[uuid.UUID, datetime]
    emitted: set[uuid.UUID]
    last_step_at: datetime | None
    end_reason: str | None
    end_n_steps: int | None
    end_requested_at: datetime | None
    closed_at: datetime | None


async def lock_session(conn: AsyncConnection, session_id: str) -> None:
    await conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:s, 7))"), {"s": session_id}
    )


# --- archive --------------------------------------------------------------------------------


async def archive_step(conn: AsyncConnection, step: Step) -> bool:
    """Store a step (metadata + full payload); False when it was there already."""
    inserted = await conn.execute(
        insert(m.StepPayload)
        .values(step_id=step.step_id, session_id=step.session_id, payload=_payload(step))
        .on_conflict_do_nothing()
    )
    await conn.execute(
        insert(m.Step)
        .values(
            step_id=step.step_id,
            session_id=step.session_id,
            group_id=step.group_id,
            turn_type=step.turn_type,
            turn_index=step.turn_index,
            model=step.request.model,
            engine=step.engine,
            weight_version=step.weight_version,
            finish_reason=step.response.finish_reason,
            n_tool_calls=len(step.response.message.tool_calls or []),
            prompt_tokens=step.usage.prompt_tokens,
            completion_tokens=step.usage.completion_tokens,
            latency_ms=step.latency_ms,
            created_at=step.created_at,
        )
        .on_conflict_do_nothing()
    )
    # a session that did not come through a gateway (a replayed or foreign topic) gets its row
    await conn.execute(
        insert(m.Session)
        .values(session_id=step.session_id, group_id=step.group_id, status="active")
        .on_conflict_do_nothing()
    )
    statement = insert(m.PipelineSession).values(
        session_id=step.session_id, last_step_at=func.now()
    )
    await conn.execute(
        statement.on_conflict_do_update(
            index_elements=["session_id"], set_={"last_step_at": func.now()}
        )
    )
    return bool(inserted.rowcount)


async def archive_event(conn: AsyncConnection, event: SessionEvent) -> bool:
    inserted = await conn.execute(
        insert(m.SessionEventRow)
        .values(
            event_id=event.event_id,
            session_id=event.session_id,
            kind=event.kind,
            step_id=event.step_id,
            reward=event.reward,
            score=event.score,
            text=event.text,
            reason=event.reason,
            payload=_payload(event),
            created_at=event.created_at,
        )
        .on_conflict_do_nothing()
    )
    if event.kind in ("ended", "refreshed"):
        values = {
            "end_reason": "refreshed"
            if event.kind == "refreshed"
            else (event.reason or "ended")[:16],
            "end_n_steps": event.n_steps,
            "end_requested_at": func.now(),
        }
        statement = insert(m.PipelineSession).values(session_id=event.session_id, **values)
        table = m.PipelineSession.__table__
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=["session_id"],
                set_={
                    k: func.coalesce(table.c[k], statement.excluded[k]) for k in values
                },  # the first end wins
            )
        )
    elif event.kind == "reward" and event.step_id is None:
        await conn.execute(
            update(m.Session)
            .where(m.Session.session_id == event.session_id)
            .values(episode_reward=event.reward)
        )
    return bool(inserted.rowcount)


async def archive_weight(conn: AsyncConnection, event: WeightEvent) -> None:
    stamp = {"updating": "updating_at", "ready": "ready_at", "failed": "failed_at"}[event.status]
    values = {
        "status": event.status,
        "kind": event.kind,
        "checkpoint_path": event.checkpoint_path,
        "adapter_name": event.adapter_name,
        "trainer_step": event.trainer_step,
        "error": event.error,
        stamp: event.created_at,
    }
    statement = insert(m.WeightVersion).values(policy=event.policy, version=event.version, **values)
    table = m.WeightVersion.__table__
    set_: dict[str, Any] = {
        k: func.coalesce(statement.excluded[k], table.c[k]) for k in values if k != "status"
    }
    # a late 'updating' never overwrites 'ready' or 'failed'
    set_["status"] = (
        text(
            "CASE WHEN weight_versions.status IN ('ready', 'failed') THEN weight_versions.status"
            " ELSE excluded.status END"
        )
        if event.status == "updating"
        else statement.excluded.status
    )
    await conn.execute(
        statement.on_conflict_do_update(index_elements=["policy", "version"], set_=set_)
    )


async def record_turns(conn: AsyncConnection, turns: list[Turn]) -> None:
    for turn in turns:
        await conn.execute(
            insert(m.Turn)
            .values(
                turn_id=turn.turn_id,
                session_id=turn.session_id,
                step_id=turn.step.step_id,
                turn_index=turn.step.turn_index,
                next_step_id=turn.next_step_id,
                has_next_state=turn.next_state is not None,
                closed_reason=turn.closed_reason,
                is_last=turn.is_last,
            )
            .on_conflict_do_nothing()
        )


async def archive_judgement(conn: AsyncConnection, judgement: Judgement) -> bool:
    """Store a judgement; the first one of a turn wins (a re-judged turn keeps its first)."""
    inserted = await conn.execute(
        insert(m.Judgement)
        .values(
            judgement_id=judgement.judgement_id,
            turn_id=judgement.turn.turn_id,
            session_id=judgement.session_id,
            step_id=judgement.turn.step.step_id,
            judge_model=judgement.judge_model,
            prm_score=judgement.prm_score,
            prm_votes=list(judgement.prm_votes),
            hint=judgement.hint,
            n_hint_votes=len(judgement.hint_votes),
            has_teacher=judgement.teacher_logprobs is not None,
            explicit_reward=judgement.explicit_reward,
            feedback_score=judgement.feedback_score,
            payload=_payload(judgement),
        )
        .on_conflict_do_nothing()
    )
    return bool(inserted.rowcount)


async def judged(conn: AsyncConnection, judgement_id: uuid.UUID) -> bool:
    row = await conn.execute(
        select(m.Judgement.judgement_id).where(m.Judgement.judgement_id == judgement_id)
    )
    return row.first() is not None


# --- sessions -------------------------------------------------------------------------------


async def session_view(conn: AsyncConnection, session_id: str) -> SessionView | None:
    row = (
        await conn.execute(
            select(m.PipelineSession.__table__).where(m.PipelineSession.session_id == session_id)
        )
    ).first()
    if row is None:
        return None
    payloads = await conn.execute(
        select(m.StepPayload.payload, m.StepPayload.created_at).where(
            m.StepPayload.session_id == session_id
        )
    )
    steps, arrived = [], {}
    for payload, created_at in payloads:
        step = _decode(Step, payload)
        steps.append(step)
        arrived[step.step_id] = created_at
    emitted = await conn.execute(select(m.Turn.turn_id).where(m.Turn.session_id == session_id))
    return SessionView(
        steps=steps,
        arrived_at=arrived,
        emitted={t for (t,) in emitted},
        last_step_at=row.last_step_at,
        end_reason=row.end_reason,
        end_n_steps=row.end_n_steps,
        end_requested_at=row.end_requested_at,
        closed_at=row.closed_at,
    )


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


async def sessions_to_assemble(conn: AsyncConnection, limit: int = 200) -> list[str]:
    table = m.PipelineSession
    rows = await conn.execute(
        select(table.session_id)
        .where(table.closed_at.is_not(None), table.assembled_at.is_(None))
        .limit(limit)
    )
    return [r for (r,) in rows]


# --- samples: the outbox --------------------------------------------------------------------


async def gate(conn: AsyncConnection, policy: str, update_timeout_s: float) -> Gate:
    row = (
        await conn.execute(
            text(
                "SELECT COALESCE(MAX(version) FILTER (WHERE status = 'ready'), 0) AS ready,"
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


async def assemble_inputs(
    conn: AsyncConnection, session_id: str
) -> tuple[list[Judgement], list[SessionEvent]] | None:
    """A closed, not yet assembled session's judgements and events; None until all are judged."""
    state = (
        await conn.execute(
            select(m.PipelineSession.closed_at, m.PipelineSession.assembled_at).where(
                m.PipelineSession.session_id == session_id
            )
        )
    ).first()
    if state is None or state.closed_at is None or state.assembled_at is not None:
        return None
    pending = await conn.scalar(
        text(
            "SELECT count(*) FROM turns t WHERE t.session_id = :s AND NOT EXISTS"
            " (SELECT 1 FROM judgements j WHERE j.turn_id = t.turn_id)"
        ),
        {"s": session_id},
    )
    if pending:
        return None  # cheap: most calls come before the last judgement
    turn_ids = {
        t
        for (t,) in await conn.execute(
            select(m.Turn.turn_id).where(m.Turn.session_id == session_id)
        )
    }
    judgements: dict[uuid.UUID, Judgement] = {}
    rows = await conn.execute(
        select(m.Judgement.turn_id, m.Judgement.payload).where(m.Judgement.session_id == session_id)
    )
    for turn_id, payload in rows:
        if turn_id in turn_ids and turn_id not in judgements and payload is not None:
            judgements[turn_id] = _decode(Judgement, payload)
    if len(judgements) < len(turn_ids):
        return None
    events = [
        _decode(SessionEvent, p)
        for (p,) in await conn.execute(
            select(m.SessionEventRow.payload).where(m.SessionEventRow.session_id == session_id)
        )
    ]
    return list(judgements.values()), events


async def store_samples(
    conn: AsyncConnection,
    session_id: str,
    drafts: list[Draft],
    g: Gate,
    max_staleness: int,
    topic: str,
) -> tuple[list[Sample], dict[str, int]]:
    """Write a session's samples with their release status; returns those to publish now."""
    to_publish: list[Sample] = []
    counts: dict[str, int] = {}
    for draft in drafts:
        status = release_status(draft.sample, draft.has_signal, g, max_staleness)
        sample = released(draft.sample, g) if status == "pending" else draft.sample
        counts[status] = counts.get(status, 0) + 1
        inserted = await conn.execute(
            insert(m.Sample)
            .values(
                sample_id=sample.sample_id,
                topic=topic,
                session_id=sample.session_id,
                group_id=sample.group_id,
                step_id=sample.step_id,
                turn_id=sample.turn_id,
                method=sample.method,
                reward=sample.reward,
                reward_source=sample.reward_source,
                weight_version=sample.weight_version,
                released_at_version=sample.released_at_version,
                n_prompt_tokens=len(sample.prompt_token_ids),
                n_response_tokens=len(sample.response_token_ids),
                status=status,
                payload=_payload(sample),
            )
            .on_conflict_do_nothing()
        )
        if inserted.rowcount and status == "pending":
            to_publish.append(sample)
    await conn.execute(
        update(m.PipelineSession)
        .where(m.PipelineSession.session_id == session_id)
        .values(assembled_at=func.now(), n_samples=sum(d.has_signal for d in drafts))
    )
    return to_publish, counts


async def release_held(
    conn: AsyncConnection, g: Gate, max_staleness: int, limit: int = 500
) -> tuple[list[Sample], int]:
    """Held samples once no update is open: stale ones dropped, the others made pending."""
    if g.updating:
        return [], 0
    rows = await conn.execute(
        select(m.Sample.sample_id, m.Sample.payload)
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
        select(m.Sample.payload)
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
        select(m.Sample.payload)
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
