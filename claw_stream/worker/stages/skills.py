"""The skills stage: the lessons of each archived judgement (`logic/lessons.py`) become
skills of the user who taught them (`store/skills.py`), on the assemble agent's batch, after
the judgements are archived: a lesson needs nothing the samples wait for.

A lesson that cannot be kept (Postgres away past the retries) is logged and left: the turn is
archived and trained as ever, and the same lesson taught again is kept then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import func, select

from claw_stream.events import Judgement
from claw_stream.skills.config import SkillsSettings
from claw_stream.skills.lesson import Lesson
from claw_stream.skills.scope import user_scope
from claw_stream.store import models as m
from claw_stream.store import skills as store
from claw_stream.store.db import is_database_down
from claw_stream.worker.logic.lessons import lessons
from claw_stream.worker.stages.io import WorkerIO, infra_retries

log = logging.getLogger(__name__)


class SkillLearner:
    name = "skills"

    def __init__(self, io: WorkerIO, settings: SkillsSettings):
        self.io = io
        self.settings = settings

    async def on_judgements(self, judgements: Sequence[Judgement]) -> None:
        if not self.settings.enabled:
            return
        found = [(j, lesson) for j in judgements for lesson in lessons(j, self.settings.sources)]
        if not found:
            return
        try:
            async for attempt in infra_retries():
                with attempt:
                    await self._learn(found)
        except Exception as exc:
            if is_database_down(exc):
                log.warning("%d lessons not kept: Postgres is away (%r)", len(found), exc)
            else:
                log.exception("%d lessons not kept", len(found))

    async def _learn(self, found: list[tuple[Judgement, Lesson]]) -> None:
        s = self.settings
        async with self.io.db.begin() as conn:
            rows = await conn.execute(
                select(
                    m.Session.session_id,
                    m.Session.tenant,
                    func.coalesce(m.Session.owner_key_hash, m.Session.key_hash),
                ).where(m.Session.session_id.in_({j.session_id for j, _ in found}))
            )
            users = {sid: (tenant, key) for sid, tenant, key in rows}
            for judgement, lesson in found:
                tenant, key = users.get(judgement.session_id, (None, None))
                scope = user_scope(judgement.turn.step.tenant or tenant, key)
                learned = await store.learn(
                    conn,
                    lesson,
                    scope,
                    threshold=s.similarity,
                    promote_min_users=s.promote_min_users,
                )
                if learned.counted:
                    outcome = "new" if learned.new else "confirmed"
                    self.io.metrics.skills.labels(outcome).inc()
                if learned.promoted is not None:
                    self.io.metrics.skills.labels("promoted").inc()
