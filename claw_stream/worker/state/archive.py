"""The archive: steps, session events, turns and judgements, each written once by its id."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    bindparam,
    func,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.events import (
    Judgement,
    SessionEvent,
    Step,
    Turn,
)
from claw_stream.ids import judgement_id_of
from claw_stream.store import models as m
from claw_stream.worker.stages.step_cache import StepCache
from claw_stream.worker.state.rows import Known, as_json, as_payload, jsonb_param

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
    payloads = [as_json(s) for s in unique]
    rows = [
        {"step_id": s.step_id, "session_id": s.session_id, "payload_json": payload}
        for s, payload in zip(unique, payloads, strict=True)
    ]
    inserted = await conn.execute(
        insert(m.StepPayload)
        .values(payload=jsonb_param())
        .on_conflict_do_nothing()
        .returning(m.StepPayload.step_id),
        rows,
    )
    new = {step_id for (step_id,) in inserted}
    if cache is not None:
        for step, payload in zip(unique, payloads, strict=True):
            if step.step_id in new:
                cache.put(step, len(payload))
    await conn.execute(insert(m.StepRow).on_conflict_do_nothing(), [_step_row(s) for s in unique])
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
        "tenant": step.tenant,
        "created_at": step.created_at,
    }


def end_values(event: SessionEvent) -> dict[str, Any]:
    """What an end or refresh asks of its session (the first end wins)."""
    reason = "refreshed" if event.kind == "refreshed" else (event.reason or "ended")[:16]
    return {"end_reason": reason, "end_n_steps": event.n_steps}


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
            "payload": as_payload(event),
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
        insert(m.TurnRow).on_conflict_do_nothing(),
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
        insert(m.JudgementRow).values(payload=jsonb_param()).on_conflict_do_nothing(),
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
        "payload_json": text if text is not None else as_json(judgement),
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
        insert(m.JudgementRow)
        .values(payload=jsonb_param())
        .on_conflict_do_nothing()
        .returning(m.JudgementRow.judgement_id),
        [_judgement_row(j, texts.get(j.judgement_id)) for j in unique.values()],
    )
    return {judgement_id: unique[judgement_id] for (judgement_id,) in inserted}


async def turn_facts(conn: AsyncConnection, turns: list[Turn]) -> dict[uuid.UUID, list[str] | None]:
    """For turns about to be judged: None for one judged already, else its feedback texts;
    turns of sessions that have feedback text are left out (`feedback_texts` reads them)."""

    ids = {judgement_id_of(t.turn_id): t.turn_id for t in turns}
    rows = await conn.execute(
        select(m.JudgementRow.judgement_id).where(m.JudgementRow.judgement_id.in_(list(ids)))
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


async def skip_judging(
    conn: AsyncConnection, judged_as: list[tuple[Turn, uuid.UUID]], judge_model: str = ""
) -> None:
    """Turns that must not be trained (their step or session switched off, or held out for
    the replay: `judge_model` HELD_OUT): each gets an empty judgement row, already sampled, so
    that its segment is assembled without it and a redelivered turn is not judged."""
    if not judged_as:
        return
    await conn.execute(
        insert(m.JudgementRow)
        .values(
            [
                {
                    "judgement_id": judgement_id,
                    "turn_id": turn.turn_id,
                    "session_id": turn.session_id,
                    "step_id": turn.step.step_id,
                    "judge_model": judge_model,
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
        select(m.JudgementRow.judgement_id).where(m.JudgementRow.judgement_id == judgement_id)
    )
    return row.first() is not None
