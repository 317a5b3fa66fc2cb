"""The per-session advisory lock that every writer of a session's rows takes (the worker's
stitch, judge and release passes; forget), derived in this one place so that they exclude
each other."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


async def lock_sessions(conn: AsyncConnection, session_ids: Collection[str]) -> None:
    """The locks of these sessions, held to the end of the transaction, taken in one statement
    in key order: two takers never wait on each other in a cycle."""
    await conn.execute(
        text(
            "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(s, 7) AS k"
            " FROM unnest(CAST(:s AS text[])) AS s ORDER BY k OFFSET 0) AS keys"
        ),
        {"s": list(session_ids)},
    )
