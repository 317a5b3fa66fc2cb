"""Turns the judge could not answer yet (a busy or timed-out judge): when to ask again, and when to give up."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import (
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.events import (
    Turn,
)
from claw_stream.store import models as m
from claw_stream.worker.state.rows import as_json, as_text, decode, jsonb_param

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
                payload=jsonb_param(),
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
            {"payload_json": as_json(turn)},
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
        select(m.JudgeRetry.turn_id, as_text(m.JudgeRetry.payload))
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
    return [decode(Turn, r[1]) for r in due]


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
