"""What a user said may not be trained or kept: sessions switched off, sessions forgotten.

The switches live in Postgres, which every stage reads (the gateway stamps new Steps, the
worker skips judging and releasing, the trainer withdraws samples it has not taken yet, replay
skips), so "don't train" and "forget" take effect within one statement of the request, with
no wait on any topic.

Forgetting deletes every row of a session from every table that has a `session_id` column
(found from the models, so a table added later is covered), plus the `/rl/start_session` retry
answers naming it, under the same advisory lock the worker takes per session: a step the worker
is archiving at that moment lands before the delete, and any later one finds the session
forgotten and is dropped. Only the session id stays, in `forgotten_sessions`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Table, delete, func, insert, or_, select
from sqlalchemy.dialects.postgresql import ARRAY, array
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from claw_stream.store import models as m
from claw_stream.store import skills
from claw_stream.store.locks import lock_sessions


def hash_key(api_key: str) -> str:
    """How keys are stored (the gateway's session store uses the same)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def session_tables() -> list[Table]:
    """Every table that holds rows of a session, children before parents."""
    return [
        t
        for t in reversed(m.Base.metadata.sorted_tables)
        if "session_id" in t.c and t.name != m.ForgottenSession.__tablename__
    ]


async def untrainable(conn: AsyncConnection, session_ids: Iterable[str]) -> set[str]:
    """Those of these sessions that are switched off or forgotten."""
    ids = sorted(set(session_ids))
    if not ids:
        return set()
    rows = await conn.execute(
        select(m.Session.session_id)
        .where(m.Session.session_id.in_(ids), m.Session.train.is_(False))
        .union(select(m.ForgottenSession.session_id).where(m.ForgottenSession.session_id.in_(ids)))
    )
    return {r[0] for r in rows}


async def forgotten(conn: AsyncConnection, session_ids: Iterable[str]) -> set[str]:
    ids = sorted(set(session_ids))
    if not ids:
        return set()
    rows = await conn.execute(
        select(m.ForgottenSession.session_id).where(m.ForgottenSession.session_id.in_(ids))
    )
    return {r[0] for r in rows}


class NothingToForget(LookupError):
    """No session matched; the message says what was looked for."""


class ForgottenAlready(LookupError):
    def __init__(self, session_id: str, at: datetime):
        self.session_id, self.at = session_id, at
        super().__init__(f"session {session_id} was forgotten already, at {at.isoformat()}")


@dataclass
class Forgotten:
    sessions: list[str]
    removed: dict[str, int] = field(default_factory=dict)  # rows deleted per table


async def find_sessions(
    conn: AsyncConnection,
    *,
    session_id: str | None = None,
    api_key: str | None = None,
    before: datetime | None = None,
) -> list[str]:
    """The sessions one forget names: a session, every session a key was bound to, or every
    session last seen before a time. Raises NothingToForget or ForgottenAlready."""
    if session_id is not None:
        gone = await conn.execute(
            select(m.ForgottenSession.forgotten_at).where(
                m.ForgottenSession.session_id == session_id
            )
        )
        at = gone.scalar()
        if at is not None:
            raise ForgottenAlready(session_id, at)
        found = await conn.execute(
            select(m.Session.session_id)
            .where(m.Session.session_id == session_id)
            .union(select(m.StepRow.session_id).where(m.StepRow.session_id == session_id))
        )
        if found.first() is None:
            raise NothingToForget(f"unknown session {session_id}")
        return [session_id]
    if api_key is not None:
        h = hash_key(api_key)
        rows = await conn.execute(
            select(m.Session.session_id).where(
                or_(m.Session.owner_key_hash == h, m.Session.key_hash == h)
            )
        )
        ids = sorted({r[0] for r in rows})
        if not ids:
            raise NothingToForget("no session was ever bound to this key")
        return ids
    assert before is not None, "a session, a key or a time"
    last_seen = (
        select(m.Session.session_id, m.Session.last_seen_at.label("at"))
        .union_all(select(m.StepRow.session_id, m.StepRow.created_at))
        .subquery()
    )
    rows = await conn.execute(
        select(last_seen.c.session_id)
        .group_by(last_seen.c.session_id)
        .having(func.max(last_seen.c.at) < before)
    )
    ids = sorted({r[0] for r in rows} - await forgotten(conn, [r[0] for r in rows]))
    if not ids:
        raise NothingToForget(f"no session was last seen before {before.isoformat()}")
    return ids


async def tenant_sessions(conn: AsyncConnection, tenant: str) -> list[str]:
    """Every session a tenant's calls made, not forgotten yet: those started for it and
    those its calls reached (steps.tenant)."""
    rows = await conn.execute(
        select(m.Session.session_id)
        .where(m.Session.tenant == tenant)
        .union(select(m.StepRow.session_id).where(m.StepRow.tenant == tenant))
    )
    ids = [r[0] for r in rows]
    return sorted(set(ids) - await forgotten(conn, ids))


async def forget_tenant(conn: AsyncConnection, tenant: str) -> dict[str, int]:
    """What Postgres holds of a tenant's adapter (its versions, its training steps), deleted;
    and the mark that tells the trainer to delete its checkpoints (`forgotten_tenants`)."""
    removed = {}
    for model in (m.WeightVersion, m.TrainingStep):
        done = await conn.execute(delete(model).where(model.policy == tenant))
        removed[model.__tablename__] = done.rowcount or 0
    mark = pg_insert(m.ForgottenTenant).values(tenant=tenant)
    await conn.execute(
        mark.on_conflict_do_update(index_elements=["tenant"], set_={"forgotten_at": func.now()})
    )
    return removed


async def forgotten_tenants(conn: AsyncConnection) -> list[str]:
    return list((await conn.execute(select(m.ForgottenTenant.tenant))).scalars())


async def tenant_gone(conn: AsyncConnection, tenant: str) -> None:
    """The trainer deleted the tenant's checkpoints: its mark goes."""
    await conn.execute(delete(m.ForgottenTenant).where(m.ForgottenTenant.tenant == tenant))


async def forget(conn: AsyncConnection, session_ids: Collection[str]) -> Forgotten:
    """Delete every row of these sessions and remember that they are forgotten (inside the
    caller's transaction)."""
    out = Forgotten(sorted(session_ids))
    # the worker's locks, in its order (forget took them in name order and the worker's batch
    # in key order: two takers could wait on each other in a cycle)
    await lock_sessions(conn, out.sessions)
    for table in session_tables():
        done = await conn.execute(delete(table).where(table.c.session_id.in_(out.sessions)))
        out.removed[table.name] = out.removed.get(table.name, 0) + (done.rowcount or 0)
    answers = await conn.execute(
        delete(m.StartRequest).where(
            m.StartRequest.answer["session_ids"].has_any(_text_array(out.sessions))
        )
    )
    out.removed["start_requests"] = answers.rowcount or 0
    # what the sessions taught leaves the skills; a skill only they taught goes
    out.removed["skills"] = await skills.forget_sessions(conn, out.sessions)
    per_session: dict[str, Any] = {k: v for k, v in out.removed.items() if v}
    await conn.execute(
        insert(m.ForgottenSession),
        [{"session_id": s, "removed": per_session} for s in out.sessions],
    )
    return out


def _text_array(values: list[str]) -> Any:
    return array(values, type_=Text).cast(ARRAY(Text))
