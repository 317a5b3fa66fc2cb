"""Which version a policy (the shared one or a tenant's) serves, as weight_versions says: the
version of the newest ready_at, whether a newer one was served before it (a rollback), and
the rejected candidates."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

log = logging.getLogger(__name__)

SERVING = (
    "SELECT version, checkpoint_path FROM weight_versions WHERE policy = :p"
    " AND ready_at IS NOT NULL ORDER BY ready_at DESC, version DESC LIMIT 1"
)


@dataclass(frozen=True)
class ServingView:
    """What Postgres says of the policy's versions (rows of weight_versions)."""

    serving: int  # the version of the newest ready_at (0: nothing published yet)
    serving_path: str | None
    served_newer: bool  # a version newer than `serving` was served before: it was rolled back
    rejected: frozenset[int]


async def serving_view(conn: AsyncConnection, policy: str) -> ServingView:
    row = (await conn.execute(text(SERVING), {"p": policy})).first()
    serving, path = (int(row.version), row.checkpoint_path) if row else (0, None)
    newer = await conn.scalar(
        text(
            "SELECT count(*) FROM weight_versions WHERE policy = :p AND ready_at IS NOT NULL"
            " AND version > :v"
        ),
        {"p": policy, "v": serving},
    )
    rejected = await conn.execute(
        text("SELECT version FROM weight_versions WHERE policy = :p AND status = 'rejected'"),
        {"p": policy},
    )
    return ServingView(serving, path, bool(newer), frozenset(r for (r,) in rejected))


async def serving_view_or_none(
    db: async_sessionmaker[AsyncSession], policy: str
) -> ServingView | None:
    """The serving view, read so that an outage never stops training: None while Postgres does
    not answer (the callers ask again later)."""
    try:
        async with db.begin() as session:
            return await serving_view(await session.connection(), policy)
    except (SQLAlchemyError, OSError) as exc:
        log.warning("cannot read the serving version of %s: %s", policy, exc)
        return None
