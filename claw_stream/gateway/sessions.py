"""Session state in Postgres, so several gateway replicas can serve one session.

API keys are stored only as SHA-256 hashes. Every LLM call bumps the session's step counter
(its turn index) and last-seen time in one statement; idle sessions are ended by whichever
replica's sweep gets to them first (UPDATE ... RETURNING hands each to exactly one).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import secrets
import time
from dataclasses import dataclass

import asyncpg

log = logging.getLogger(__name__)
KEY_CACHE_S = 2.0


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def asyncpg_dsn(database_url: str) -> str:
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    group_id: str | None
    status: str


@dataclass(frozen=True)
class Ended:
    session_id: str
    n_steps: int  # steps counted in the session: the stitcher waits for all of them


@dataclass(frozen=True)
class Touch:
    turn_index: int
    created: bool  # the first call of a session not seen before


class SessionStore:
    def __init__(self, database_url: str):
        self.dsn = asyncpg_dsn(database_url)
        self.pool: asyncpg.Pool | None = None
        self._key_cache: dict[str, tuple[float, SessionRow | None]] = {}
        self._fallback = itertools.count()

    async def start(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=8, command_timeout=5)

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    @property
    def _db(self) -> asyncpg.Pool:
        assert self.pool is not None, "SessionStore.start() first"
        return self.pool

    async def start_session(
        self, api_key: str | None, group_id: str | None
    ) -> tuple[str, str, Ended | None]:
        """A new session bound to api_key (a new key when None), and the one it replaced."""
        api_key = api_key or "claw-sk-" + secrets.token_urlsafe(24)
        key_hash = hash_key(api_key)
        session_id = "s-" + secrets.token_hex(12)
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "UPDATE sessions SET key_hash = NULL, status = 'ended', ended_at = now(),"
                " end_reason = COALESCE(end_reason, 'refreshed')"
                " WHERE key_hash = $1 RETURNING session_id, n_steps",
                key_hash,
            )
            await conn.execute(
                "INSERT INTO sessions (session_id, group_id, convention, key_hash, status)"
                " VALUES ($1, $2, 'api_key', $3, 'active')",
                session_id,
                group_id,
                key_hash,
            )
        self._key_cache.pop(key_hash, None)
        return session_id, api_key, Ended(row["session_id"], row["n_steps"]) if row else None

    async def by_key(self, api_key: str) -> SessionRow | None:
        key_hash = hash_key(api_key)
        cached = self._key_cache.get(key_hash)
        if cached and time.monotonic() - cached[0] < KEY_CACHE_S:
            return cached[1]
        row = await self._db.fetchrow(
            "SELECT session_id, group_id, status FROM sessions WHERE key_hash = $1", key_hash
        )
        found = SessionRow(row["session_id"], row["group_id"], row["status"]) if row else None
        self._key_cache[key_hash] = (time.monotonic(), found)
        return found

    async def get(self, session_id: str) -> SessionRow | None:
        row = await self._db.fetchrow(
            "SELECT session_id, group_id, status FROM sessions WHERE session_id = $1", session_id
        )
        return SessionRow(row["session_id"], row["group_id"], row["status"]) if row else None

    async def touch(self, session_id: str, group_id: str | None, convention: str) -> Touch:
        """Count one more call of the session (creating it when new); never fails the request."""
        try:
            row = await self._db.fetchrow(
                "INSERT INTO sessions (session_id, group_id, convention, status, n_steps, last_seen_at)"
                " VALUES ($1, $2, $3, 'active', 1, now())"
                " ON CONFLICT (session_id) DO UPDATE SET n_steps = sessions.n_steps + 1,"
                " last_seen_at = now(), status = 'active', ended_at = NULL, end_reason = NULL,"
                " group_id = COALESCE(EXCLUDED.group_id, sessions.group_id)"
                " RETURNING n_steps - 1 AS turn_index, (xmax = 0) AS inserted",
                session_id,
                group_id,
                convention,
            )
        except (OSError, asyncpg.PostgresError, AssertionError) as exc:
            log.warning("session store unavailable (%s); turn index from memory", exc)
            return Touch(next(self._fallback), False)
        return Touch(row["turn_index"], bool(row["inserted"]))

    async def end(self, session_id: str, reason: str) -> Ended | None:
        """End an active session; None when it was not active (already ended or unknown)."""
        row = await self._db.fetchrow(
            "UPDATE sessions SET status = 'ended', ended_at = now(), end_reason = $2"
            " WHERE session_id = $1 AND status = 'active' RETURNING session_id, n_steps",
            session_id,
            reason,
        )
        return Ended(row["session_id"], row["n_steps"]) if row else None

    async def expire_idle(self, idle_s: float) -> list[Ended]:
        rows = await self._db.fetch(
            "UPDATE sessions SET status = 'ended', ended_at = now(), end_reason = 'idle_timeout'"
            " WHERE status = 'active' AND last_seen_at < now() - make_interval(secs => $1)"
            " RETURNING session_id, n_steps",
            float(idle_s),
        )
        return [Ended(r["session_id"], r["n_steps"]) for r in rows]
