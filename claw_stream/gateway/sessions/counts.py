"""A session's turn index: every call counted in Postgres, or through an outage in memory.

Every LLM call bumps its session's step counter (its turn index) and last-seen time in one
statement, on a connection of its own with `synchronous_commit = off`: it waits for no WAL
flush, which would otherwise be most of a call's added latency. A Postgres crash can forget the
last fraction of a second of bumps, so a later call may reuse a turn index; the stitcher orders
equal indexes by creation time.

While Postgres is away (`outage.py`) a call is not counted there: its turn index continues the
session's count as this process last saw it, and the session's count, last-seen time and group
wait in `journal`, written first thing when Postgres is back (`n_steps = GREATEST(...)`: written
twice, it counts once). Two replicas serving one session through an outage may hand out the
same index; the stitcher then orders the two by creation time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from claw_stream.gateway.sessions.outage import Outage

log = logging.getLogger(__name__)
COUNTS_KEPT = 200_000  # sessions whose next turn index this process remembers (~30 MB)


@dataclass(frozen=True)
class Touch:
    turn_index: int
    created: bool  # the first call of a session not seen before
    counted: bool = True  # False: the store was down and the index came from memory
    train: bool = True  # the session's switch: False, its steps are never trained


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
RETURNING session_id, n_steps, (xmax = 0) AS inserted, train
"""

# the journal of an outage: each session's count at least as far as this process handed out
_CATCH_UP = """
INSERT INTO sessions AS s (session_id, group_id, convention, status, n_steps, last_seen_at)
SELECT id, grp, conv, 'active', n, seen
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::timestamptz[])
    AS calls(id, grp, conv, n, seen)
ON CONFLICT (session_id) DO UPDATE SET n_steps = GREATEST(s.n_steps, EXCLUDED.n_steps),
    last_seen_at = GREATEST(s.last_seen_at, EXCLUDED.last_seen_at),
    status = CASE WHEN s.status = 'revoked' THEN s.status ELSE 'active' END,
    ended_at = CASE WHEN s.status = 'revoked' THEN s.ended_at END,
    end_reason = CASE WHEN s.status = 'revoked' THEN s.end_reason END,
    group_id = COALESCE(s.group_id, EXCLUDED.group_id)
"""


@dataclass
class Journaled:
    """What an outage's calls of one session would have written."""

    group_id: str | None
    convention: str
    n_steps: int  # counted at least this far
    last_seen: datetime


class TurnCounter:
    """Counts each call in its session; hands out turn indexes."""

    def __init__(self, dsn: str, outage: Outage):
        self.dsn = dsn
        self.outage = outage
        self._touches: list[_Call] = []
        self._bumping: asyncio.Task[None] | None = None
        self._touch_conn: asyncpg.Connection | None = None
        # sessions seen switched off: while the store is down their steps stay untrained
        self._untrained: dict[str, None] = {}
        self.journal: dict[str, Journaled] = {}
        self._counts: OrderedDict[str, int] = OrderedDict()  # session -> its next turn index
        self._conn_lock = asyncio.Lock()  # the bump connection: bumps and `catch_up`

    async def stop(self) -> None:
        if self._touch_conn is not None:
            await self._touch_conn.close()

    def forget(self, session_id: str) -> None:
        self._untrained.pop(session_id, None)
        self._counts.pop(session_id, None)

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
            if self.outage.down:  # `catch_up` finds it back: no connect attempt per call
                self._from_memory(calls)
                continue
            try:
                touches = await self._bump_rows(calls)
            except Exception as exc:  # the calls go on whatever happened to the store
                if not self.outage.caught(exc):
                    log.warning("session store failed (%r); turn indexes from memory", exc)
                self._drop_conn()
                self._from_memory(calls)
                continue
            for call, touch in zip(calls, touches, strict=True):
                if not call.done.done():
                    call.done.set_result(touch)

    def _from_memory(self, calls: list[_Call]) -> None:
        """Turn indexes continuing each session's count as this process knows it; the counts
        wait in the journal (a call that bumped before the connection broke may be written
        again: the journal's `GREATEST` counts it once)."""
        now = datetime.now(UTC)
        for call in calls:
            index = self._counts.get(call.session_id, 0)
            self._count(call.session_id, index + 1)
            old = self.journal.get(call.session_id)
            self.journal[call.session_id] = Journaled(
                call.group_id or (old.group_id if old else None),
                call.convention,
                index + 1,
                now,
            )
            if not call.done.done():
                train = call.session_id not in self._untrained
                call.done.set_result(Touch(index, False, False, train))

    def _count(self, session_id: str, n_steps: int) -> None:
        self._counts[session_id] = n_steps
        self._counts.move_to_end(session_id)
        while len(self._counts) > COUNTS_KEPT:
            self._counts.popitem(last=False)

    def _drop_conn(self) -> None:
        if self._touch_conn is not None:
            self._touch_conn.terminate()
            self._touch_conn = None

    async def _conn(self) -> asyncpg.Connection:
        if self._touch_conn is None or self._touch_conn.is_closed():
            self._touch_conn = await asyncpg.connect(
                self.dsn,
                timeout=3,
                command_timeout=5,
                server_settings={"synchronous_commit": "off"},
            )
        return self._touch_conn

    async def _write_journal(self, conn: asyncpg.Connection) -> None:
        if not self.journal:
            return
        entries = dict(self.journal)
        await conn.execute(
            _CATCH_UP,
            list(entries),
            [e.group_id for e in entries.values()],
            [e.convention for e in entries.values()],
            [e.n_steps for e in entries.values()],
            [e.last_seen for e in entries.values()],
        )
        for session_id, entry in entries.items():
            if self.journal.get(session_id) is entry:
                del self.journal[session_id]

    async def catch_up(self) -> bool:
        """Look for Postgres (while it is away) and write the journal once it is back; whether
        it is reachable. Called every second or so by the gateway."""
        try:
            async with self._conn_lock:
                conn = await self._conn()
                if self.journal:
                    await self._write_journal(conn)
                else:
                    await conn.fetchval("SELECT 1")
        except Exception as exc:
            if not self.outage.caught(exc):
                raise
            self._drop_conn()
            return False
        self.outage.mark_up()
        return True

    async def _bump_rows(self, calls: list[_Call]) -> list[Touch]:
        sessions: dict[str, list[_Call]] = {}
        for call in calls:
            sessions.setdefault(call.session_id, []).append(call)
        async with self._conn_lock:
            conn = await self._conn()
            await self._write_journal(conn)  # an outage's counts before any new one
            rows = await conn.fetch(
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
            self._count(row["session_id"], row["n_steps"])
            self.remember(row["session_id"], row["train"])
            for k, call in enumerate(same):
                touches[id(call)] = Touch(
                    first_index + k, bool(row["inserted"]) and k == 0, train=row["train"]
                )
        return [touches[id(call)] for call in calls]

    def remember(self, session_id: str, train: bool) -> None:
        if train:
            self._untrained.pop(session_id, None)
            return
        self._untrained[session_id] = None
        while len(self._untrained) > 100_000:
            del self._untrained[next(iter(self._untrained))]
