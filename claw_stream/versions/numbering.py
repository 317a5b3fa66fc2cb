"""The number a new version gets: one above every version known anywhere, so that after going
back (a rollback, a rejection) the numbers go on past every version made and never repeat."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from claw_stream.versions import records

log = logging.getLogger(__name__)


def next_version(*known: int) -> int:
    """Version numbers never repeat: one above every version known anywhere."""
    return max(known, default=0) + 1


async def next_free_version(
    db: async_sessionmaker[AsyncSession], policy: str, checkpoints: Path, current: int
) -> int:
    """One above every version of `policy` known: in weight_versions, in its checkpoint
    directory, in the trainer (`current`). Postgres down: numbered from the checkpoints."""
    try:
        async with db.begin() as session:
            known = await records.newest_version(await session.connection(), policy)
    except (SQLAlchemyError, OSError) as exc:
        log.warning("versions of %s unknown (%s): numbering from the checkpoints", policy, exc)
        known = 0
    saved = [int(p.name[1:]) for p in checkpoints.glob("v*") if p.name[1:].isdigit()]
    return next_version(known, current, *saved)
