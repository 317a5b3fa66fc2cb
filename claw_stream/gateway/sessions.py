"""Session state in Postgres, so several gateway replicas can serve one session.

API keys are stored only as SHA-256 hashes. Every LLM call bumps the session's step counter
(its turn index) and last-seen time in one statement; idle sessions are ended by whichever
replica's sweep gets to them first (UPDATE ... RETURNING hands each to exactly one).

That per-call bump runs on a connection of its own with `synchronous_commit = off`: it waits
for no WAL flush, which would otherwise be most of a call's added latency. A Postgres crash
can forget the last fraction of a second of bumps, so a later call may reuse a turn index; the
stitcher orders equal indexes by creation time. Everything else (binding keys, ending
sessions) goes through the pool and commits durably.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
import time
from dataclasses import dataclass

import asyncpg

from claw_stream.store.db import asyncpg_dsn

log = logging.getLogger(__name__)
KEY_CACHE_S = 2.0


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


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
    counted: bool = True  # False: the store was down and the index came from memory


@dataclass
class _Call:
    session_id: str
    group_id: str | None
    convention: str
    done: asyncio.Future[Touch]


_BUMP = """
INSERT INTO sessions AS s (session_id, group_id, convention, status, n_steps, last_seen_at)
SELECT id, grp, conv, 'active', n, now() FROM unnest($1::text[], $2::text[], $3::text[], $4::int[])
    AS calls(id, grp, conv, n)
ON CONFLICT (session_id) DO UPDATE SET n_steps = s.n_steps + EXCLUDED.n_steps,
    last_seen_at = now(), status = 'active', ended_at = NULL, end_reason = NULL,
    group_id = COALESCE(EXCLUDED.group_id, s.group_id)
RETURNING session_id, n_steps, (xmax = 0) AS inserted
"""


class SessionStore:
    def __init__(self, database_url: str):
        self.dsn = asyncpg_dsn(database_url)
        self.pool: asyncpg.Pool | None = None
        self._key_cache: dict[str, tuple[float, SessionRow | None]] = {}
        self._fallback = itertools.count()
        self._touches: list[_Call] = []
        self._bumping: asyncio.Task[None] | None = None
        self._touch_conn: asyncpg.Connection | None = None

    async def start(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=8, command_timeout=5)

    async def stop(self) -> None:
        if self._touch_conn is not None:
            await self._touch_conn.close()
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

    async def rebind(self, api_key: str) -> tuple[SessionRow, bool] | None:
        """The key's session if it is active; else a new session bound to the key (True):
        a key whose session ended or idled starts the next episode instead of locking its
        agent out. None for an unknown key. Concurrent calls (of any replica) with the same
        ended key get one new session between them."""
        key_hash = hash_key(api_key)
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT session_id, group_id, status FROM sessions WHERE key_hash = $1 FOR UPDATE",
                key_hash,
            )
            if row is None:
                return None
            if row["status"] in ("active", "revoked"):  # another call rebound it first
                return SessionRow(row["session_id"], row["group_id"], row["status"]), False
            session_id = "s-" + secrets.token_hex(12)
            await conn.execute("UPDATE sessions SET key_hash = NULL WHERE key_hash = $1", key_hash)
            await conn.execute(
                "INSERT INTO sessions (session_id, convention, key_hash, status)"
                " VALUES ($1, 'api_key', $2, 'active')",
                session_id,
                key_hash,
            )
        self._key_cache.pop(key_hash, None)
        return SessionRow(session_id, None, "active"), True

    async def revoke(self, api_key: str) -> tuple[str, Ended | None] | None:
        """Revoke a key: its calls get 401 from now on (after at most KEY_CACHE_S on other
        replicas). Returns its session and, when that was active, the end; None when unknown."""
        key_hash = hash_key(api_key)
        row = await self._db.fetchrow(
            "WITH old AS (SELECT session_id, status FROM sessions WHERE key_hash = $1 FOR UPDATE)"
            " UPDATE sessions s SET status = 'revoked', ended_at = COALESCE(s.ended_at, now()),"
            " end_reason = COALESCE(s.end_reason, 'revoked') FROM old"
            " WHERE s.session_id = old.session_id"
            " RETURNING s.session_id, s.n_steps, old.status AS was",
            key_hash,
        )
        self._key_cache.pop(key_hash, None)
        if row is None:
            return None
        ended = Ended(row["session_id"], row["n_steps"]) if row["was"] == "active" else None
        return row["session_id"], ended

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
        """Count one more call of the session (creating it when new); never fails the request.

        Calls that arrive while a bump is under way are bumped together by the next statement,
        on a connection of its own: one round trip for many calls, and none of the pool's
        acquire/release work, which cost more CPU than the statement.
        """
        done = asyncio.get_running_loop().create_future()
        self._touches.append(_Call(session_id, group_id, convention, done))
        if self._bumping is None or self._bumping.done():
            self._bumping = asyncio.create_task(self._bump())
        return await done

    async def _bump(self) -> None:
        while self._touches:
            calls, self._touches = self._touches, []
            try:
                for call, touch in zip(calls, await self._bump_rows(calls), strict=True):
                    if not call.done.done():
                        call.done.set_result(touch)
            except Exception as exc:  # the calls go on whatever happened to the store
                log.warning("session store unavailable (%r); turn indexes from memory", exc)
                if self._touch_conn is not None:
                    self._touch_conn.terminate()
                    self._touch_conn = None
                for call in calls:
                    if not call.done.done():
                        call.done.set_result(Touch(next(self._fallback), False, False))

    async def _bump_rows(self, calls: list[_Call]) -> list[Touch]:
        sessions: dict[str, list[_Call]] = {}
        for call in calls:
            sessions.setdefault(call.session_id, []).append(call)
        if self._touch_conn is None or self._touch_conn.is_closed():
            self._touch_conn = await asyncpg.connect(
                self.dsn,
                timeout=3,
                command_timeout=5,
                server_settings={"synchronous_commit": "off"},
            )
        rows = await self._touch_conn.fetch(
            _BUMP,
            list(sessions),
            [next((c.group_id for c in cs if c.group_id), None) for cs in sessions.values()],
            [cs[0].convention for cs in sessions.values()],
            [len(cs) for cs in sessions.values()],
        )
        # a session's k calls of this batch take its k newest indexes, in arrival order
        touches: dict[int, Touch] = {}
        for row in rows:
            same = sessions[row["session_id"]]
            first_index = row["n_steps"] - len(same)
            for k, call in enumerate(same):
                touches[id(call)] = Touch(first_index + k, bool(row["inserted"]) and k == 0)
        return [touches[id(call)] for call in calls]

    async def give_back(self, session_id: str, turn_index: int) -> bool:
        """Uncount a call that made no Step, when no later call of the session was counted:
        the next call takes its turn index, so the stitcher waits for no index that never
        comes. With a later call counted, or the session ended (its count announced), the gap
        stays and the stitcher waits it out."""
        status = await self._db.execute(
            "UPDATE sessions SET n_steps = n_steps - 1"
            " WHERE session_id = $1 AND n_steps = $2 AND status = 'active'",
            session_id,
            turn_index + 1,
        )
        return status == "UPDATE 1"

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
