"""The learning report's rows, read from Postgres: versions, trainer steps, live main-line
turns with their judgements, feedback calls and the steps that trained them, each version's
first answer, and the held-out scores."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.evaluation.report.learning import (
    Feedback,
    LiveTurn,
    ReportRows,
    VersionRow,
)
from claw_stream.evaluation.report.replayed import ReplayRow
from claw_stream.store import models as m
from claw_stream.store.consent import hash_key
from claw_stream.store.db import make_engine


@dataclass(frozen=True)
class Scope:
    """Which traffic the live columns and the waits count: a key's sessions, one session,
    since a time. Versions and held-out sets are the policy's: a key or a session does not
    narrow them, a time does. A tenant's report is of its own adapter: its versions, its
    held-out sets and replays, the live turns it answered; without a tenant, the shared
    policy's (a tenant's adapter is not one of its versions)."""

    key: str | None = None
    session: str | None = None
    since: datetime | None = None
    tenant: str | None = None

    def words(self) -> str:
        parts = [
            f"tenant {self.tenant}" if self.tenant else "",
            "the key's sessions" if self.key else "",
            f"session {self.session}" if self.session else "",
            f"since {self.since:%Y-%m-%d %H:%M} UTC" if self.since else "",
        ]
        return ", ".join(p for p in parts if p) or "all sessions"


async def read(database_url: str, policy: str, scope: Scope) -> ReportRows:
    """The rows of `policy`'s report, or, where the scope names a tenant, of its adapter's
    (versions, steps and held-out rows are kept under the tenant's name)."""
    policy = scope.tenant or policy
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            sessions = await _sessions(conn, scope)
            return ReportRows(
                policy=policy,
                scope=scope.words(),
                versions=await _versions(conn, policy),
                trained_per_step=await _trained(conn, policy, scope),
                turns=await _turns(conn, policy, sessions, scope),
                feedback=await _feedback(conn, sessions, scope),
                first_served=await _first_served(conn, policy, scope),
                held_out=await _held_out(conn, policy, scope),
                replay=await _replay(conn, policy, sessions, scope),
            )
    finally:
        await engine.dispose()


async def _sessions(conn: AsyncConnection, scope: Scope) -> list[str] | None:
    if scope.session is not None:
        return [scope.session]
    if scope.key is None and scope.tenant is None:
        return None
    where: list[ColumnElement[bool]] = []
    if scope.key is not None:
        h = hash_key(scope.key)
        where.append(or_(m.Session.owner_key_hash == h, m.Session.key_hash == h))
    if scope.tenant is not None:
        # a session whose steps named the tenant (X-Agent-Id) is the tenant's too
        named = select(m.StepRow.session_id).where(m.StepRow.tenant == scope.tenant)
        where.append(or_(m.Session.tenant == scope.tenant, m.Session.session_id.in_(named)))
    rows = await conn.execute(select(m.Session.session_id).where(and_(*where)))
    return [r[0] for r in rows]


def _served_by(policy: str, scope: Scope) -> ColumnElement[bool]:
    """The steps of a tenant's report: its calls, answered by its adapter (`served_model`
    `tenant@vN`, in the Step's payload) or, before it had one, by the untrained base (v0, the
    adapter's baseline); without a tenant, the shared policy's: any step but one a tenant's
    adapter answered."""
    served = m.StepPayload.payload["served_model"].astext
    if scope.tenant is not None:
        return and_(
            m.StepRow.tenant == scope.tenant,
            or_(served.like(f"{scope.tenant}@v%"), m.StepRow.weight_version == 0),
        )
    return or_(served.is_(None), served.not_like("%@v%"), served.like(f"{policy}@v%"))


def _within(column: Any, sessions: list[str] | None) -> ColumnElement[bool]:
    return true() if sessions is None else column.in_(sessions)


def _after(column: Any, scope: Scope) -> ColumnElement[bool]:
    return true() if scope.since is None else column >= scope.since


async def _versions(conn: AsyncConnection, policy: str) -> list[VersionRow]:
    w = m.WeightVersion
    rows = await conn.execute(
        select(w.version, w.status, w.trainer_step, w.ready_at, w.rolled_back_from, w.reason).where(
            w.policy == policy
        )
    )
    return [VersionRow(*r) for r in rows]


async def _trained(conn: AsyncConnection, policy: str, scope: Scope) -> dict[int, int]:
    t = m.TrainingStep
    rows = await conn.execute(
        select(t.step, t.n_samples).where(t.policy == policy, _after(t.created_at, scope))
    )
    return {step: n for step, n in rows}


async def _turns(
    conn: AsyncConnection, policy: str, sessions: list[str] | None, scope: Scope
) -> list[LiveTurn]:
    """Main-line turns with the judge's vote, and the newest thumbs and explicit reward sent
    on their step (the worker applies those when it assembles the sample; thumbs sent on "the
    last answer", without a step, are not counted here)."""
    s, j, e = m.StepRow, m.JudgementRow, m.SessionEventRow

    def newest(kind: str, column: Any) -> Any:
        return (
            select(column)
            .where(e.step_id == s.step_id, e.kind == kind)
            .order_by(e.created_at.desc())
            .limit(1)
            .scalar_subquery()
        )

    rows = await conn.execute(
        select(
            s.weight_version,
            select(func.max(j.prm_score)).where(j.step_id == s.step_id).scalar_subquery(),
            newest("feedback", e.score),
            newest("reward", e.reward),
        )
        .where(
            s.turn_type == "main",
            s.train.is_(True),
            _within(s.session_id, sessions),
            _after(s.created_at, scope),
            _served_by(policy, scope),
        )
        .outerjoin(m.StepPayload, m.StepPayload.step_id == s.step_id)
    )
    return [LiveTurn(*r) for r in rows]


async def _feedback(
    conn: AsyncConnection, sessions: list[str] | None, scope: Scope
) -> list[Feedback]:
    e, sample = m.SessionEventRow, m.SampleRow
    trained = (
        select(func.min(sample.trained_in_step))
        .where(sample.step_id == e.step_id)
        .scalar_subquery()
    )
    rows = await conn.execute(
        select(e.created_at, trained).where(
            e.kind.in_(("feedback", "reward")),
            e.step_id.is_not(None),
            _within(e.session_id, sessions),
            _after(e.created_at, scope),
        )
    )
    return [Feedback(at, step) for at, step in rows]


async def _first_served(conn: AsyncConnection, policy: str, scope: Scope) -> dict[int, datetime]:
    s = m.StepRow
    rows = await conn.execute(
        select(s.weight_version, func.min(s.created_at))
        .outerjoin(m.StepPayload, m.StepPayload.step_id == s.step_id)
        .where(_served_by(policy, scope))
        .group_by(s.weight_version)
    )
    return {v: at for v, at in rows}


async def _held_out(
    conn: AsyncConnection, policy: str, scope: Scope
) -> list[tuple[str, int, str, float]]:
    h = m.HeldOutResult
    rows = await conn.execute(
        select(h.source, h.version, h.item, h.score).where(
            and_(h.policy == policy, _after(h.created_at, scope))
        )
    )
    return [(source, version, item, score) for source, version, item, score in rows]


async def _replay(
    conn: AsyncConnection, policy: str, sessions: list[str] | None, scope: Scope
) -> list[ReplayRow]:
    """The held-out turns answered again: of the key's or the session's turns where the scope
    names one (the replay is per user)."""
    r = m.ReplayResult
    rows = await conn.execute(
        select(r.version, r.scorer, r.score, r.rule_score, r.judge_score, r.judge).where(
            and_(r.policy == policy, _within(r.session_id, sessions), _after(r.created_at, scope))
        )
    )
    return [ReplayRow(*row) for row in rows]
