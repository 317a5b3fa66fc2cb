"""The sample outbox: judgements due for assembly, samples written with the release status decided in `logic/release.py`, and those to send again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from claw_stream.events import (
    Judgement,
    Sample,
    SessionEvent,
    Step,
    Turn,
)
from claw_stream.store import models as m
from claw_stream.worker.logic.release import Decided, Gate, Gates
from claw_stream.worker.state.rows import (
    Known,
    Pair,
    as_json,
    as_payload,
    as_text,
    decode,
    jsonb_param,
)

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


async def gates(
    conn: AsyncConnection, policies: set[str], shared: str, update_timeout_s: float
) -> Gates:
    """The gate of each of `policies` (the shared policy's and tenants' adapters')."""
    by_policy = {p: await gate(conn, p, update_timeout_s) for p in sorted(policies)}
    return Gates(shared, by_policy)


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
            **({"sessions": sessions} if sessions is not None else {}),
        },
    )
    return [_judgement(judgement_id, p, known) for judgement_id, p in rows]


def _judgement(judgement_id: uuid.UUID, payload: str | None, known: Known) -> Judgement:
    return known[judgement_id] if payload is None else decode(Judgement, payload)


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
            events[(session_id, segment)].append(decode(SessionEvent, payload))
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
            **({"sessions": sessions} if sessions is not None else {}),
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
            update(m.JudgementRow)
            .where(
                m.JudgementRow.judgement_id.in_(judgement_ids), m.JudgementRow.sampled_at.is_(None)
            )
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


async def last_without_signal(conn: AsyncConnection, pair: Pair) -> Sample | None:
    """The last turn's sample of a segment none of whose samples has a signal (per_turn's
    at-least-one rule sends it all the same)."""
    row = (
        await conn.execute(
            text(
                "SELECT x.payload::text AS payload FROM samples x"
                " JOIN turns t ON t.turn_id = x.turn_id"
                " WHERE t.session_id = :s AND t.segment = :g AND x.status = 'no_signal'"
                " ORDER BY t.turn_index DESC, x.created_at DESC LIMIT 1"
            ),
            {"s": pair[0], "g": pair[1]},
        )
    ).first()
    return None if row is None else decode(Sample, row.payload)


async def due_tails(
    conn: AsyncConnection, session_id: str, tail_timeout_s: float
) -> list[tuple[int, Step]]:
    """The session's segments whose tail waited `tail_timeout_s`, with the tail step."""
    g = m.PipelineSegment
    rows = await conn.execute(
        select(g.segment, as_text(m.StepPayload.payload))
        .join(m.StepPayload, m.StepPayload.step_id == g.tail_step_id)
        .where(
            g.session_id == session_id,
            g.tail_step_id.is_not(None),
            g.closed_at < datetime.now(UTC) - timedelta(seconds=tail_timeout_s),
        )
    )
    out = []
    for segment, payload in rows:
        step = decode(Step, payload)
        out.append((segment, step.model_copy(update={"turn_type": "main"})))
    return out


async def session_events(conn: AsyncConnection, session_id: str) -> list[SessionEvent]:
    """What the client passed about the session: its `/rl/start_session` and `/rl/set_reward`
    events (`reward_sources.session_metadata` merges them, later keys winning)."""
    e = m.SessionEventRow
    rows = await conn.execute(
        select(as_text(e.payload)).where(
            e.session_id == session_id,
            e.kind.in_(("started", "reward")),
        )
    )
    return [decode(SessionEvent, p) for (p,) in rows]


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
    conn: AsyncConnection, decided: list[Decided], topic: str
) -> tuple[list[Sample], dict[str, int]]:
    """Write samples with their release status (`release.decide`), in one statement; returns
    those to publish now (a sample written before keeps its row and is not sent again)."""
    if not decided:
        return [], {}
    statuses = {sample.sample_id: (status, sample) for status, sample in decided}
    rows = [
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
            "payload_json": as_json(sample),
        }
        for status, sample in statuses.values()
    ]
    inserted = await conn.execute(
        insert(m.SampleRow)
        .values(payload=jsonb_param())
        .on_conflict_do_nothing()
        .returning(m.SampleRow.sample_id),
        rows,
    )
    to_publish: list[Sample] = []
    counts: dict[str, int] = {}
    for (sample_id,) in inserted:
        status, sample = statuses[sample_id]
        counts[status] = counts.get(status, 0) + 1
        if status == "pending":
            to_publish.append(sample)
    return to_publish, counts


async def held_samples(conn: AsyncConnection, limit: int = 500) -> list[Sample]:
    """Samples held while an update was open, oldest first, locked for this transaction."""
    rows = await conn.execute(
        select(as_text(m.SampleRow.payload))
        .where(m.SampleRow.status == "held")
        .order_by(m.SampleRow.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [decode(Sample, payload) for (payload,) in rows]


async def set_released(conn: AsyncConnection, decided: list[Decided]) -> None:
    """Held samples with their new status (`release.decide_held`)."""
    for status, sample in decided:
        await conn.execute(
            update(m.SampleRow)
            .where(m.SampleRow.sample_id == sample.sample_id)
            .values(
                status=status,
                payload=as_payload(sample),
                released_at_version=sample.released_at_version,
                updated_at=func.now(),
            )
        )


async def orphans(conn: AsyncConnection, older_than_s: float, limit: int = 500) -> list[Sample]:
    """Pending samples nobody marked published (their worker died between commit and ack)."""
    cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
    rows = await conn.execute(
        select(as_text(m.SampleRow.payload))
        .where(m.SampleRow.status == "pending", m.SampleRow.updated_at < cutoff)
        .order_by(m.SampleRow.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    out = [decode(Sample, p) for (p,) in rows]
    if out:  # claim them for a while, so two sweepers do not both resend
        await conn.execute(
            update(m.SampleRow)
            .where(m.SampleRow.sample_id.in_([s.sample_id for s in out]))
            .values(updated_at=func.now())
        )
    return out


async def untrained(conn: AsyncConnection, older_than_s: float, limit: int = 1000) -> list[Sample]:
    """Published samples no training step recorded (`trained_in_step`), published or last
    looked at more than `older_than_s` ago; claimed for another `older_than_s`."""
    cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
    rows = await conn.execute(
        select(as_text(m.SampleRow.payload))
        .where(
            m.SampleRow.status == "published",
            m.SampleRow.trained_in_step.is_(None),
            m.SampleRow.updated_at < cutoff,
        )
        .order_by(m.SampleRow.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    out = [decode(Sample, p) for (p,) in rows]
    if out:
        await conn.execute(
            update(m.SampleRow)
            .where(m.SampleRow.sample_id.in_([s.sample_id for s in out]))
            .values(updated_at=func.now())
        )
    return out


async def mark_published(engine: AsyncEngine, sample_ids: list[uuid.UUID]) -> None:
    if not sample_ids:
        return
    async with engine.begin() as conn:
        await conn.execute(
            update(m.SampleRow)
            .where(m.SampleRow.sample_id.in_(sample_ids), m.SampleRow.status == "pending")
            .values(status="published", updated_at=func.now())
        )
