"""The skills a call carries: its user's active skills (and everyone's), the most relevant to
what the session is about first, within `skills.max_tokens`, as one marked block
(`claw_stream/skills/text.py`) added to the engine's prompt; the Step keeps the client's
messages and notes the block (`request.extra.claw_skills`: the skill ids and the text).

A session keeps its block from call to call, so the engine's prefix cache holds, until its
user's skills change (checked at most every `skills.refresh_s`). Ranked by Postgres full-text
search against the session's first user message. Never in the way: `X-Claw-Skills: off`,
`skills.enabled: false` or a side call carries none (a side call asks with `X-Claw-Skills: on`),
and while Postgres is away a call carries the block its session had (or none) rather than wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from claw_stream.gateway.sessions.auth import presented_key
from claw_stream.gateway.sessions.outage import Outage
from claw_stream.skills.config import SkillsSettings
from claw_stream.skills.scope import ANONYMOUS, scopes_of, user_scope
from claw_stream.skills.text import Chosen, fit, query_of, render, similarity, words
from claw_stream.store.consent import hash_key

log = logging.getLogger(__name__)
SKILLS_HEADER = "x-claw-skills"
MAX_SESSIONS = 20_000  # sessions whose block is remembered (~1 KB each)
QUERY_WORDS = 32  # the first user message's words that rank the skills
CANDIDATES = 64
LOOKUP_TIMEOUT_S = 1.0  # a call never waits longer on its skills


@dataclass(frozen=True)
class Carried:
    ids: list[str]
    text: str
    position: str

    def note(self) -> dict[str, Any]:
        return {"ids": self.ids, "block": self.text, "position": self.position}


@dataclass
class _Session:
    stamp: tuple[int, Any]
    carried: Carried | None


def caller(tenant: str | None, convention: str, headers: Mapping[str, str]) -> str:
    """The user a call serves: its tenant, else its session key (hashed as Postgres keeps it),
    else anonymous."""
    if tenant:
        return user_scope(tenant, None)
    key = presented_key(headers)
    if convention == "api_key" and key:
        return user_scope(None, hash_key(key))
    return ANONYMOUS


class SkillInjector:
    def __init__(self, pool: Callable[[], asyncpg.Pool], settings: SkillsSettings, outage: Outage):
        self.pool = pool
        self.settings = settings
        self.outage = outage
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._stamps: dict[str, tuple[float, tuple[int, Any]]] = {}

    def wanted(self, turn_type: str, headers: Mapping[str, str]) -> bool:
        """Main calls carry skills unless `X-Claw-Skills: off`; side calls only with `on` (an
        evaluation asking as the user would be answered)."""
        if not self.settings.enabled:
            return False
        said = headers.get(SKILLS_HEADER, "").strip().lower()
        if said in ("off", "false", "0", "no"):
            return False
        return turn_type == "main" or said in ("on", "true", "1", "yes")

    async def carried(
        self, session_id: str, user: str, messages: list[dict[str, Any]]
    ) -> Carried | None:
        """The block this call of `session_id` carries; None: none."""
        held = self._sessions.get(session_id)
        if self.outage.down:
            return held.carried if held else None
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                stamp = await self._stamp(user)
                if held is not None and held.stamp == stamp:
                    self._sessions.move_to_end(session_id)
                    return held.carried
                carried = await self._choose(user, query_of(messages)) if stamp[0] else None
        except Exception as exc:  # a call never fails for its skills
            if not self.outage.caught(exc):
                log.warning("skills of %s not looked up: %r", session_id, exc)
            return held.carried if held else None
        self._sessions[session_id] = _Session(stamp, carried)
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return carried

    def forget(self, session_ids: Collection[str]) -> None:
        for session_id in session_ids:
            self._sessions.pop(session_id, None)

    async def _stamp(self, user: str) -> tuple[int, Any]:
        """What changes when any skill of the user's scopes does: their count and the last
        change (a retired skill, a delete, an edit, a new one)."""
        now = time.monotonic()
        cached = self._stamps.get(user)
        if cached is not None and now - cached[0] < self.settings.refresh_s:
            return cached[1]
        row = await self.pool().fetchrow(
            "SELECT count(*) AS n, max(updated_at) AS at FROM skills WHERE scope = ANY($1)",
            scopes_of(user),
        )
        stamp = (int(row["n"]), row["at"])
        self._stamps[user] = (now, stamp)
        if len(self._stamps) > MAX_SESSIONS:
            self._stamps.pop(next(iter(self._stamps)))
        return stamp

    async def _choose(self, user: str, query: str) -> Carried | None:
        terms = " or ".join(sorted(words(query))[:QUERY_WORDS]) or "skill"
        rows = await self.pool().fetch(
            "SELECT skill_id, text FROM skills WHERE scope = ANY($1)"
            " AND state IN ('active', 'pinned') ORDER BY state = 'pinned' DESC,"
            " ts_rank(to_tsvector('english', text), websearch_to_tsquery('english', $2)) DESC,"
            " confirmations DESC, updated_at DESC LIMIT $3",
            scopes_of(user),
            terms,
            CANDIDATES,
        )
        distinct: list[Chosen] = []
        for row in rows:  # a user's own skill and everyone's copy of it: once
            if all(similarity(row["text"], c.text) < self.settings.similarity for c in distinct):
                distinct.append(Chosen(str(row["skill_id"]), row["text"]))
        chosen = fit(distinct, self.settings.max_tokens, self.settings.max_skills)
        if not chosen:
            return None
        return Carried([c.skill_id for c in chosen], render(chosen), self.settings.position)
