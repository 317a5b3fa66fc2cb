"""Sessions without ids: a call joins the session whose main line its messages extend.

OpenClaw, unmodified, names no session: every call carries the whole conversation so far. After
each Step the gateway stores the hashes of the call's messages plus its answer (the session's
"heads"); a later call with no session id whose messages start with a head joins that session,
the longest match winning. OpenClaw also appends an ephemeral context message to each request
(`tests/fixtures/agents/openclaw/`: a trailing `<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>` user
message) that the next request no longer carries, so heads are stored with up to
`EPHEMERAL_TAIL` trailing request messages left out.

A gateway answers before Postgres has the new heads (they are written in the background), so
each replica also keeps the heads it wrote last in memory: a client that sends its next call the
moment it has the answer (the doctor's two calls: 1 in 3 runs on a busy 2-core CI machine went to
two sessions) joins its session on the replica that answered it.

While Postgres is away (`outage.py`) calls join by this replica's memory alone, and the heads
it could not write wait in `unstored` until `catch_up` writes them.

Messages are compared by what a client echoes back of them: role, text, tool calls (arguments
as parsed JSON) and tool-call id; anything else (reasoning, names, cache hints) is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import asyncpg
import orjson

from claw_stream.dialect import flatten_content
from claw_stream.gateway.sessions.outage import Outage

log = logging.getLogger(__name__)
EPHEMERAL_TAIL = 2
RECENT_HEADS = 50_000  # ~6 MB; heads of the calls answered last by this replica


def message_key(message: Mapping[str, Any]) -> bytes:
    calls = []
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments)
        calls.append([function.get("name"), arguments])
    text = flatten_content(message.get("content")).strip()
    key = [message.get("role"), text, calls, message.get("tool_call_id") or ""]
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)


def _chain(previous: bytes, message: Mapping[str, Any]) -> bytes:
    return hashlib.blake2b(previous + message_key(message), digest_size=16).digest()


def prefix_hashes(messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The hash of every prefix: element k covers messages[: k + 1]."""
    hashes, current = [], b""
    for message in messages:
        current = _chain(current, message)
        hashes.append(current)
    return hashes


def heads(messages: Sequence[Mapping[str, Any]], reply: Mapping[str, Any]) -> list[bytes]:
    """Where the main line stands after `reply` answered `messages`: the request with 0 to
    EPHEMERAL_TAIL trailing messages left out (never the first), then the reply."""
    prefixes = prefix_hashes(messages)
    n = len(prefixes)
    return [_chain(prefixes[n - 1 - cut], reply) for cut in range(min(EPHEMERAL_TAIL, n - 1) + 1)]


class MainLines:
    """Session heads in Postgres, so every gateway replica can join a call to its session."""

    def __init__(
        self, pool: Any, window_s: float, recent: int = RECENT_HEADS, outage: Outage | None = None
    ):
        self.pool = pool  # asyncpg.Pool, or a callable returning it once started
        self.window_s = window_s
        self.recent: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self.recent_max = recent
        self.outage = outage or Outage()
        self.unstored: OrderedDict[bytes, str] = OrderedDict()  # head -> session, for Postgres

    def _pool(self) -> asyncpg.Pool:
        pool: asyncpg.Pool = self.pool() if callable(self.pool) else self.pool
        return pool

    async def join(self, messages: Sequence[Mapping[str, Any]]) -> str | None:
        """The session whose main line these messages extend (the longest match), or None."""
        prefixes = prefix_hashes(messages)
        if len(prefixes) < 2:
            return None
        candidates = prefixes[:-1]  # a head is followed by at least the next message
        where = {h: k for k, h in enumerate(candidates)}
        local = self._recent_match(candidates)
        if local is not None and where[local[0]] == len(candidates) - 1:
            return local[1]  # the longest possible match: Postgres cannot hold a longer one
        found = [] if self.outage.down else await self._stored(candidates)
        if local is not None:
            found.append(local)
        if not found:
            return None
        return max(found, key=lambda hit: where[hit[0]])[1]

    async def _stored(self, candidates: list[bytes]) -> list[tuple[bytes, str]]:
        try:
            rows = await self._pool().fetch(
                "SELECT head, session_id FROM session_heads WHERE head = ANY($1::bytea[])"
                " AND seen_at > now() - make_interval(secs => $2) ORDER BY seen_at DESC",
                candidates,
                self.window_s,
            )
        except Exception as exc:
            if not self.outage.caught(exc):
                raise
            return []
        return [(bytes(r["head"]), str(r["session_id"])) for r in rows]

    def _recent_match(self, candidates: Sequence[bytes]) -> tuple[bytes, str] | None:
        """The longest head among this replica's recent ones, within the join window."""
        oldest = time.monotonic() - self.window_s
        for head in reversed(candidates):
            hit = self.recent.get(head)
            if hit is not None and hit[1] > oldest:
                return head, hit[0]
        return None

    def extend(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], reply: Mapping[str, Any]
    ) -> Coroutine[Any, Any, None]:
        """Record where the session's main line stands after this call: its heads, hashed once,
        kept in memory now (before the client has the answer); the coroutine returned writes
        them to Postgres for the other replicas, in the background."""
        found = heads(messages, reply)
        now = time.monotonic()
        for head in found:
            self.recent[head] = (session_id, now)
            self.recent.move_to_end(head)
        while len(self.recent) > self.recent_max:
            self.recent.popitem(last=False)
        return self._store(session_id, found)

    async def _store(self, session_id: str, found: list[bytes]) -> None:
        """The heads in Postgres (or, while it is away, in `unstored`); old heads expire
        (`expire`)."""
        if not self.outage.down:
            try:
                await self._write(found, [session_id] * len(found))
                return
            except Exception as exc:
                if not self.outage.caught(exc):
                    raise
        for head in found:
            self.unstored[head] = session_id
            self.unstored.move_to_end(head)
        while len(self.unstored) > self.recent_max:
            self.unstored.popitem(last=False)

    async def _write(self, found: list[bytes], sessions: list[str]) -> None:
        await self._pool().execute(
            "INSERT INTO session_heads (head, session_id) SELECT * FROM unnest($1::bytea[],"
            " $2::text[]) ON CONFLICT (head) DO UPDATE SET session_id = EXCLUDED.session_id,"
            " seen_at = now()",
            found,
            sessions,
        )

    async def catch_up(self) -> None:
        """Write the heads an outage kept back (Postgres is back)."""
        if self.unstored:
            pending = dict(self.unstored)
            await self._write(list(pending), list(pending.values()))
            for head, session_id in pending.items():
                if self.unstored.get(head) == session_id:
                    del self.unstored[head]

    async def expire(self) -> int:
        status = await self._pool().execute(
            "DELETE FROM session_heads WHERE seen_at < now() - make_interval(secs => $1)",
            self.window_s,
        )
        return int(status.split()[-1])
