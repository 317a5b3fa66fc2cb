"""Session state in Postgres, so several gateway replicas can serve one session.

API keys are stored only as SHA-256 hashes. Every LLM call is counted in its session
(`counts.py`: its turn index); idle sessions are ended by whichever replica's sweep gets to
them first (UPDATE ... RETURNING hands each to exactly one). Binding keys and ending sessions
go through the pool and commit durably; while Postgres is away (`outage.py`) a key looked up
before is served as last seen, an end waits in `ends`, and what needs the database is refused
with 503.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import asyncpg

from claw_stream.gateway.sessions.counts import Touch, TurnCounter
from claw_stream.gateway.sessions.outage import Outage, unavailable
from claw_stream.store.consent import hash_key
from claw_stream.store.db import asyncpg_dsn

log = logging.getLogger(__name__)
KEY_CACHE_S = 2.0


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    group_id: str | None
    status: str
    tenant: str | None = None  # the tenant its key was started for


@dataclass(frozen=True)
class Ended:
    session_id: str
    n_steps: int  # steps counted in the session: the stitcher waits for all of them
    episode_reward: float | None = None  # the reward set for it, if any


@dataclass(frozen=True)
class StartAsk:
    """What `/rl/start_session` asks for (AReaL's fields and ours)."""

    api_key: str | None = None
    group_id: str | None = None
    task_id: str | None = None
    n: int = 1  # group_size: one session per group member
    request_id: str | None = None
    body_hash: str = ""
    train: bool = True  # False: the sessions' steps are never judged or trained
    tenant: str | None = None  # whose agent the sessions serve (tenants.py)


@dataclass(frozen=True)
class Grant:
    session_id: str
    api_key: str


@dataclass(frozen=True)
class Started:
    grants: list[Grant]
    group_id: str | None
    ended: Ended | None  # the session a refresh ended
    replayed: bool = False  # a retried request_id: the first call's answer

    def record(self) -> dict[str, Any]:
        """What is kept for a retry: everything but the keys."""
        return {
            "session_ids": [g.session_id for g in self.grants],
            "group_id": self.group_id,
            "ended": dataclasses.asdict(self.ended) if self.ended else None,
        }


class RequestExpired(Exception):
    """`request_expires_at` is in the past and the request was not served before."""


class RequestReused(Exception):
    """A request_id came back with a different body (or its first call never finished)."""


def _row(record: asyncpg.Record) -> SessionRow:
    return SessionRow(record["session_id"], record["group_id"], record["status"], record["tenant"])


class SessionStore:
    def __init__(self, database_url: str, key_secret: str):
        self.dsn = asyncpg_dsn(database_url)
        self.key_secret = key_secret.encode()  # derives the keys of a retried request_id
        self.pool: asyncpg.Pool | None = None
        self._key_cache: dict[str, tuple[float, SessionRow | None]] = {}
        self.outage = Outage()
        self.counter = TurnCounter(self.dsn, self.outage)
        self.ends: dict[str, str] = {}  # sessions whose end waits for Postgres, with the reason

    async def start(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=8, command_timeout=5)

    async def stop(self) -> None:
        await self.counter.stop()
        if self.pool is not None:
            await self.pool.close()

    @property
    def _db(self) -> asyncpg.Pool:
        assert self.pool is not None, "SessionStore.start() first"
        return self.pool

    async def start_sessions(self, ask: StartAsk, expires_at: float | None = None) -> Started:
        """New sessions for `/rl/start_session`: one per group member, each bound to a key.

        With `ask.api_key` the key's current session ends first (a refresh). With
        `ask.request_id` (AReaL's retry token) the first call's answer is kept, and a retry
        gets the same one: its keys are derived again from the request id, never stored."""
        async with self._db.acquire() as conn, conn.transaction():
            if ask.request_id is not None:
                # a concurrent retry waits here on the primary key until the first commits
                claimed = await conn.fetchval(
                    "INSERT INTO start_requests (request_id, body_hash) VALUES ($1, $2)"
                    " ON CONFLICT DO NOTHING RETURNING request_id",
                    ask.request_id,
                    ask.body_hash,
                )
                if claimed is None:
                    return await self._replay(conn, ask)
            if expires_at is not None and expires_at < time.time():
                # a retry of a request already served gets its answer above, expired or not
                raise RequestExpired(
                    f"the request expired at {expires_at:.0f} (unix seconds); "
                    f"it is now {time.time():.0f}"
                )
            keys = [ask.api_key] if ask.api_key else [self._new_key(ask, k) for k in range(ask.n)]
            ended = None
            if ask.api_key:
                row = await conn.fetchrow(
                    "UPDATE sessions SET key_hash = NULL, status = 'ended', ended_at = now(),"
                    " end_reason = COALESCE(end_reason, 'refreshed')"
                    " WHERE key_hash = $1 RETURNING session_id, n_steps, episode_reward",
                    hash_key(ask.api_key),
                )
                if row is not None:
                    ended = Ended(row["session_id"], row["n_steps"], row["episode_reward"])
            group_id = ask.group_id or (f"g-{secrets.token_hex(8)}" if ask.n > 1 else None)
            prefix = f"{ask.task_id}-" if ask.task_id else "s-"
            session_ids = [prefix + secrets.token_hex(12) for _ in keys]
            await conn.executemany(
                "INSERT INTO sessions (session_id, group_id, convention, key_hash, owner_key_hash,"
                " status, train, tenant) VALUES ($1, $2, 'api_key', $3, $3, 'active', $4, $5)",
                [
                    (sid, group_id, hash_key(key), ask.train, ask.tenant)
                    for sid, key in zip(session_ids, keys, strict=True)
                ],
            )
            started = Started(
                [Grant(sid, key) for sid, key in zip(session_ids, keys, strict=True)],
                group_id,
                ended,
            )
            if ask.request_id is not None:
                await conn.execute(
                    "UPDATE start_requests SET answer = $2 WHERE request_id = $1",
                    ask.request_id,
                    json.dumps(started.record()),
                )
        for key in keys:
            self._key_cache.pop(hash_key(key), None)
        return started

    def _new_key(self, ask: StartAsk, member: int) -> str:
        if ask.request_id is None:
            return "claw-sk-" + secrets.token_urlsafe(24)
        digest = hmac.new(
            self.key_secret, f"{ask.request_id}\x00{member}".encode(), hashlib.sha256
        ).digest()
        return "claw-sk-" + base64.urlsafe_b64encode(digest[:24]).decode()

    async def _replay(self, conn: asyncpg.Connection, ask: StartAsk) -> Started:
        row = await conn.fetchrow(
            "SELECT body_hash, answer FROM start_requests WHERE request_id = $1", ask.request_id
        )
        if row["body_hash"] != ask.body_hash or row["answer"] is None:
            raise RequestReused(ask.request_id or "")
        answer = json.loads(row["answer"])
        sids: list[str] = answer["session_ids"]
        keys = [ask.api_key] if ask.api_key else [self._new_key(ask, k) for k in range(len(sids))]
        ended = Ended(**answer["ended"]) if answer["ended"] else None
        grants = [Grant(sid, key) for sid, key in zip(sids, keys, strict=True)]
        return Started(grants, answer["group_id"], ended, replayed=True)

    async def rebind(self, api_key: str) -> tuple[SessionRow, bool] | None:
        """The key's session if it is active; else a new session bound to the key (True):
        a key whose session ended or idled starts the next episode instead of locking its
        agent out. None for an unknown key. Concurrent calls (of any replica) with the same
        ended key get one new session between them."""
        key_hash = hash_key(api_key)
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT session_id, group_id, status, train, tenant FROM sessions"
                " WHERE key_hash = $1 FOR UPDATE",
                key_hash,
            )
            if row is None:
                return None
            if row["status"] in ("active", "revoked"):  # another call rebound it first
                return _row(row), False
            session_id = "s-" + secrets.token_hex(12)
            await conn.execute("UPDATE sessions SET key_hash = NULL WHERE key_hash = $1", key_hash)
            await conn.execute(  # the next episode keeps the key's training switch and tenant
                "INSERT INTO sessions (session_id, convention, key_hash, owner_key_hash, status,"
                " train, tenant) VALUES ($1, 'api_key', $2, $2, 'active', $3, $4)",
                session_id,
                key_hash,
                row["train"],
                row["tenant"],
            )
        self._key_cache.pop(key_hash, None)
        return SessionRow(session_id, None, "active", row["tenant"]), True

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
        if cached and (self.outage.down or time.monotonic() - cached[0] < KEY_CACHE_S):
            return cached[1]  # while Postgres is away, as last seen
        try:
            row = await self._db.fetchrow(
                "SELECT session_id, group_id, status, tenant FROM sessions WHERE key_hash = $1",
                key_hash,
            )
        except Exception as exc:
            if not self.outage.caught(exc):
                raise
            if cached:
                return cached[1]
            raise unavailable("a session key this gateway has not seen before") from None
        found = _row(row) if row else None
        self._key_cache[key_hash] = (time.monotonic(), found)
        return found

    async def is_forgotten(self, session_id: str) -> bool:
        """Whether any process of any gateway forgot the session (`/rl/forget`). While Postgres
        is away, no: a forget needs it, and the process that served one dropped its copies."""
        if self.outage.down:
            return False
        try:
            return bool(
                await self._db.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM forgotten_sessions WHERE session_id = $1)",
                    session_id,
                )
            )
        except Exception as exc:
            if not self.outage.caught(exc):
                raise
            return False

    async def get(self, session_id: str) -> SessionRow | None:
        row = await self._db.fetchrow(
            "SELECT session_id, group_id, status, tenant FROM sessions WHERE session_id = $1",
            session_id,
        )
        return _row(row) if row else None

    async def touch(self, session_id: str, group_id: str | None, convention: str) -> Touch:
        """Count one more call of the session (creating it when new); never fails the call."""
        return await self.counter.touch(session_id, group_id, convention)

    async def catch_up(self) -> bool:
        """Whether Postgres is reachable; once it is, the outage's counts are written."""
        return await self.counter.catch_up()

    def journal_depth(self) -> int:
        return len(self.counter.journal) + len(self.ends)

    async def set_train(self, session_id: str, enabled: bool) -> bool:
        """Switch a session's training; False for an unknown session."""
        status = await self._db.execute(
            "UPDATE sessions SET train = $2 WHERE session_id = $1", session_id, enabled
        )
        if status == "UPDATE 1":
            self.counter.remember(session_id, enabled)
        return status == "UPDATE 1"

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

    async def set_episode_reward(self, session_id: str, reward: float) -> None:
        """Remember that the session has its reward, so a refresh does not default it to 0."""
        await self._db.execute(
            "UPDATE sessions SET episode_reward = $2 WHERE session_id = $1", session_id, reward
        )

    async def end(self, session_id: str, reason: str) -> Ended | None:
        """End an active session; None when it was not active (already ended or unknown)."""
        row = await self._db.fetchrow(
            "UPDATE sessions SET status = 'ended', ended_at = now(), end_reason = $2"
            " WHERE session_id = $1 AND status = 'active' RETURNING session_id, n_steps",
            session_id,
            reason,
        )
        self._forget(session_id)
        return Ended(row["session_id"], row["n_steps"]) if row else None

    async def end_when_reachable(self, session_id: str, reason: str) -> Ended | None:
        """`end`, or while Postgres is away, later (`ends`, after the journal): None then."""
        if not self.outage.down:
            try:
                return await self.end(session_id, reason)
            except Exception as exc:
                if not self.outage.caught(exc):
                    raise
        self.ends[session_id] = reason
        self._forget(session_id)
        return None

    def drop_cached(self, session_ids: Collection[str]) -> None:
        """Forget what this process remembers of these sessions (they were deleted)."""
        for session_id in session_ids:
            self._forget(session_id)
            self.counter.forget(session_id)

    def _forget(self, session_id: str) -> None:
        """Drop the cached key lookups of an ended session: its key's next call here starts
        the next episode at once (other replicas see it within KEY_CACHE_S)."""
        for key_hash, (_, row) in list(self._key_cache.items()):
            if row is not None and row.session_id == session_id:
                del self._key_cache[key_hash]

    async def expire_idle(self, idle_s: float) -> list[Ended]:
        rows = await self._db.fetch(
            "UPDATE sessions SET status = 'ended', ended_at = now(), end_reason = 'idle_timeout'"
            " WHERE status = 'active' AND last_seen_at < now() - make_interval(secs => $1)"
            " RETURNING session_id, n_steps",
            float(idle_s),
        )
        for r in rows:
            self._forget(r["session_id"])
        return [Ended(r["session_id"], r["n_steps"]) for r in rows]
