"""Skills in Postgres: learned (a near-duplicate confirms the skill it matches instead of
adding one), promoted to everyone once enough users taught the same lesson, listed, steered
(pinned, retired, edited, deleted) and forgotten with the sessions they came from.

Each scope's writers take one advisory lock (`skills:<scope>`), so two workers learning the
same user's lessons at once never make two skills of one.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, Uuid, delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.ids import derive_uuid7, uuid7
from claw_stream.skills.lesson import Lesson
from claw_stream.skills.scope import ANONYMOUS, POLICY
from claw_stream.skills.text import clean, similarity
from claw_stream.store import models as m

STATES = ("active", "pinned", "retired")
MAX_PROVENANCE = 50  # the newest turns a skill names; its confirmations count them all
EXPORTED = (
    "skill_id",
    "scope",
    "text",
    "source",
    "state",
    "confirmations",
    "teachers",
    "provenance",
    "created_at",
    "updated_at",
)
MAX_COMPARED = 5000  # skills a lesson is compared with across users, newest first


@dataclass(frozen=True)
class Learned:
    skill_id: uuid.UUID
    new: bool  # a skill of its own, not a confirmation
    counted: bool  # False: this turn had taught it already (a redelivered judgement)
    promoted: uuid.UUID | None = None  # the everyone-skill it made or confirmed


async def _lock(conn: AsyncConnection, scope: str) -> None:
    await conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 7))"), {"k": f"skills:{scope}"}
    )


def _best(rows: Sequence[Any], lesson_text: str, threshold: float) -> Any | None:
    scored = [(similarity(r.text, lesson_text), r) for r in rows]
    scored = [s for s in scored if s[0] >= threshold]
    return max(scored, key=lambda s: s[0])[1] if scored else None


async def _teach(
    conn: AsyncConnection,
    scope: str,
    lesson: Lesson,
    threshold: float,
    teachers: Collection[str],
    provenance: list[dict[str, Any]],
) -> Learned:
    """The lesson into `scope`: the skill it matches, confirmed, or a new one."""
    await _lock(conn, scope)
    rows = (
        await conn.execute(
            select(m.Skill.skill_id, m.Skill.text, m.Skill.provenance, m.Skill.teachers).where(
                m.Skill.scope == scope
            )
        )
    ).all()
    match = _best(rows, lesson.text, threshold)
    if match is None:
        skill_id = (
            derive_uuid7(uuid.UUID(lesson.turn_id), f"skill:{scope}:{lesson.source}")
            if lesson.turn_id
            else uuid7()
        )
        await conn.execute(
            insert(m.Skill).values(
                skill_id=skill_id,
                scope=scope,
                text=clean(lesson.text),
                source=lesson.source,
                teachers=sorted(teachers),
                provenance=provenance[-MAX_PROVENANCE:],
            )
        )
        return Learned(skill_id, True, True)
    seen = {(p.get("turn_id"), p.get("source")) for p in match.provenance}
    fresh = [p for p in provenance if (p.get("turn_id"), p.get("source")) not in seen]
    new_teachers = set(teachers) - set(match.teachers)
    if not fresh and not new_teachers:
        return Learned(match.skill_id, False, False)
    await conn.execute(
        update(m.Skill)
        .where(m.Skill.skill_id == match.skill_id)
        .values(
            confirmations=m.Skill.confirmations + max(len(fresh), 1),
            provenance=(list(match.provenance) + fresh)[-MAX_PROVENANCE:],
            teachers=sorted(set(match.teachers) | set(teachers)),
            updated_at=func.now(),
        )
    )
    return Learned(match.skill_id, False, True)


async def learn(
    conn: AsyncConnection,
    lesson: Lesson,
    scope: str,
    *,
    threshold: float,
    promote_min_users: int,
) -> Learned:
    """One lesson a user (`scope`) taught, inside the caller's transaction."""
    learned = await _teach(conn, scope, lesson, threshold, [scope], [lesson.provenance()])
    if not learned.counted or scope in (POLICY, ANONYMOUS):
        # the anonymous caller is no one user: it never counts towards everyone's skills
        return learned
    rows = (
        await conn.execute(
            select(m.Skill.scope, m.Skill.text, m.Skill.provenance)
            .where(
                m.Skill.scope.not_in([POLICY, ANONYMOUS]),
                m.Skill.state != "retired",
            )
            .order_by(m.Skill.updated_at.desc())
            .limit(MAX_COMPARED)
        )
    ).all()
    taught = [r for r in rows if similarity(r.text, lesson.text) >= threshold]
    users = {r.scope for r in taught}
    if len(users) < promote_min_users:
        return learned
    provenance = [p for r in taught for p in r.provenance]
    promoted = await _teach(conn, POLICY, lesson, threshold, users, provenance)
    return Learned(learned.skill_id, learned.new, True, promoted.skill_id)


async def listing(
    conn: AsyncConnection,
    scope: str | None = None,
    states: Collection[str] = STATES,
    limit: int | None = 200,
) -> list[Any]:
    query = select(m.Skill).where(m.Skill.state.in_(list(states)))
    if scope is not None:
        query = query.where(m.Skill.scope == scope)
    query = query.order_by(m.Skill.scope, m.Skill.confirmations.desc(), m.Skill.updated_at.desc())
    if limit is not None:
        query = query.limit(limit)
    return list((await conn.execute(query)).all())


async def one(conn: AsyncConnection, skill_id: uuid.UUID) -> Any | None:
    return (await conn.execute(select(m.Skill).where(m.Skill.skill_id == skill_id))).first()


async def steer(
    conn: AsyncConnection, skill_id: uuid.UUID, *, state: str | None = None, text: str | None = None
) -> bool:
    """An admin's change: a new state (active, pinned, retired) or text. False: no such skill."""
    values: dict[str, Any] = {"updated_at": func.now()}
    if state is not None:
        if state not in STATES:
            raise ValueError(f"a skill's state is one of {', '.join(STATES)}; got {state!r}")
        values["state"] = state
    if text is not None:
        if not text.strip():
            raise ValueError("a skill's text cannot be empty")
        values["text"] = clean(text)
    done = await conn.execute(update(m.Skill).where(m.Skill.skill_id == skill_id).values(values))
    return bool(done.rowcount)


async def add(conn: AsyncConnection, scope: str, text_: str, state: str = "active") -> uuid.UUID:
    """A skill an admin wrote."""
    if not text_.strip():
        raise ValueError("a skill's text cannot be empty")
    skill_id = uuid7()
    await conn.execute(
        insert(m.Skill).values(
            skill_id=skill_id,
            scope=scope,
            text=clean(text_),
            source="admin",
            state=state,
            teachers=[],
            provenance=[],
        )
    )
    return skill_id


async def remove(conn: AsyncConnection, skill_id: uuid.UUID) -> bool:
    done = await conn.execute(delete(m.Skill).where(m.Skill.skill_id == skill_id))
    return bool(done.rowcount)


async def forget_scope(conn: AsyncConnection, scope: str) -> int:
    """Every skill a user's scope holds (`forget --key`, `forget --tenant`)."""
    await _lock(conn, scope)
    done = await conn.execute(delete(m.Skill).where(m.Skill.scope == scope))
    return done.rowcount or 0


async def forget_sessions(conn: AsyncConnection, session_ids: Collection[str]) -> int:
    """What forgotten sessions taught leaves every skill; a skill that nothing else taught goes
    (an admin's own skills stay). Returns the skills deleted."""
    gone = set(session_ids)
    if not gone:
        return 0
    rows = (
        await conn.execute(
            text(
                "SELECT skill_id, provenance, source FROM skills s WHERE EXISTS (SELECT 1 FROM"
                " jsonb_array_elements(s.provenance) e WHERE e->>'session_id' = ANY(:ids))"
            ).columns(skill_id=Uuid, provenance=JSONB, source=String),
            {"ids": sorted(gone)},
        )
    ).all()
    deleted = 0
    for row in rows:
        kept = [p for p in row.provenance if p.get("session_id") not in gone]
        if len(kept) == len(row.provenance):
            continue
        if not kept and row.source != "admin":
            await conn.execute(delete(m.Skill).where(m.Skill.skill_id == row.skill_id))
            deleted += 1
        else:
            await conn.execute(
                update(m.Skill)
                .where(m.Skill.skill_id == row.skill_id)
                .values(provenance=kept, confirmations=func.greatest(len(kept), 1))
            )
    return deleted
