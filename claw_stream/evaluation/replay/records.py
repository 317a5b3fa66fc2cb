"""The replay in Postgres: the held-out turns to answer again (read from the archive), and the
results (table `replay_results`, view `replay_by_version`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import aliased

from claw_stream.evaluation.replay.pairs import HeldOutTurn, PairScore, message_text
from claw_stream.names import HELD_OUT
from claw_stream.next_state import archived_next_state
from claw_stream.store import models as m
from claw_stream.store.db import make_engine


def next_state(step: dict[str, Any], following: dict[str, Any] | None) -> str | None:
    """What came after `step`'s answer in the `following` step (both archived payloads), by the
    worker's rule (`claw_stream.next_state`), as text; None: the conversation ended there."""
    state = archived_next_state(step, following)
    after = [x.model_dump(mode="json") for x in state.messages] if state else []
    text = "\n".join(f"[{x.get('role')}] {message_text(x)}" for x in after if message_text(x))
    return text or None


def whose(
    step: type[m.StepRow], tenant: str | None, own: list[str] | Literal["all"]
) -> ColumnElement[bool]:
    """The turns of `tenant` (its adapter's); without one, the shared policy's: every turn but
    those of tenants with an adapter of their own (`own`, `tenants.adapters`)."""
    if tenant is not None:
        return step.tenant == tenant
    if own == "all":
        return step.tenant.is_(None)
    return or_(step.tenant.is_(None), step.tenant.not_in(own))


async def held_out_turns(
    database_url: str,
    limit: int,
    tenant: str | None = None,
    own: list[str] | Literal["all"] = "all",
) -> list[HeldOutTurn]:
    """The newest `limit` held-out turns of sessions still trainable (a session switched off
    or forgotten is not asked again): `tenant`'s, or the shared policy's (`whose`)."""
    t, j, s, sp = m.TurnRow, m.JudgementRow, m.Session, m.StepPayload
    following = aliased(m.StepPayload)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(
                    t.turn_id,
                    t.session_id,
                    func.coalesce(s.owner_key_hash, s.key_hash),
                    sp.payload,
                    following.payload,
                )
                .join(j, j.turn_id == t.turn_id)
                .join(sp, sp.step_id == t.step_id)
                .outerjoin(following, following.step_id == t.next_step_id)
                .outerjoin(s, s.session_id == t.session_id)
                .join(m.StepRow, m.StepRow.step_id == t.step_id)
                .where(
                    and_(
                        j.judge_model == HELD_OUT,
                        s.train.is_not(False),
                        whose(m.StepRow, tenant, own),
                    )
                )
                .order_by(t.created_at.desc())
                .limit(limit)
            )
            out = []
            for turn_id, session_id, key_hash, step, after in rows:
                request = step["request"]
                out.append(
                    HeldOutTurn(
                        turn_id,
                        session_id,
                        key_hash,
                        int(step.get("weight_version", 0)),
                        request,
                        message_text(step["response"]["message"]),
                        next_state(step, after),
                    )
                )
            return out
    finally:
        await engine.dispose()


async def save(database_url: str, policy: str, scores: Iterable[PairScore]) -> int:
    """Kept once per (policy, version, turn): a version asked again adds nothing."""
    rows = [
        {
            "policy": policy,
            "version": p.version,
            "turn_id": p.turn.turn_id,
            "session_id": p.turn.session_id,
            "key_hash": p.turn.key_hash,
            "served_version": p.turn.served_version,
            "scorer": p.scorer,
            "score": p.score,
            "rule_score": p.rule_score,
            "judge_score": p.judge_score,
            "judge": p.judge,
            "n_votes": p.votes,
            "answer": p.answer,
        }
        for p in scores
    ]
    if not rows:
        return 0
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            done = await conn.execute(
                insert(m.ReplayResult)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["policy", "version", "turn_id"])
            )
            return done.rowcount
    finally:
        await engine.dispose()
