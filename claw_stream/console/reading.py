"""What the console shows, read from Postgres: a page of sessions (indexed, counted for that page
only), one session's turns with their judgement and samples, the versions with their training
and evaluation, and the traffic of the last minutes."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Select, and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.agents.names import agent_of
from claw_stream.names import HELD_OUT
from claw_stream.next_state import archived_next_state
from claw_stream.store import models as m
from claw_stream.store.consent import hash_key
from claw_stream.store.turn_report import TurnFacts, turn_facts, why

Outcome = Literal["any", "trained", "untrained", "off"]
HASH_PREFIX = re.compile(r"[0-9a-f]{6,64}")


@dataclass(frozen=True)
class SessionFilter:
    key: str | None = None  # the key (only its hash is compared) or its hash's start
    since: datetime | None = None  # last seen at or after
    outcome: Outcome = "any"
    text: str | None = None  # a part of the session id


@dataclass(frozen=True)
class SessionLine:
    session_id: str
    named_by: str | None  # api_key | path | header
    key_hash: str | None
    started_at: datetime
    last_seen_at: datetime
    steps: int
    turns: int
    judged: int
    trained: int
    reward: float | None
    train: bool
    status: str

    @property
    def agent(self) -> str:
        """The agent that named the session (Claude Code, Codex, OpenClaw), if one did."""
        return agent_of(self.session_id)


def _filtered(f: SessionFilter) -> Select[Any]:
    s = m.Session
    query = select(s.session_id)
    if f.key:
        if HASH_PREFIX.fullmatch(f.key):  # the hash the list shows, or its start
            query = query.where(
                func.coalesce(s.owner_key_hash, s.key_hash).startswith(f.key, autoescape=True)
            )
        else:
            h = hash_key(f.key)
            query = query.where((s.key_hash == h) | (s.owner_key_hash == h))
    if f.since is not None:
        query = query.where(s.last_seen_at >= f.since)
    if f.text:
        query = query.where(s.session_id.contains(f.text, autoescape=True))
    if f.outcome == "off":
        query = query.where(s.train.is_(False))
    elif f.outcome in ("trained", "untrained"):
        trained = (
            select(m.SampleRow.sample_id)
            .where(m.SampleRow.session_id == s.session_id, m.SampleRow.trained_in_step.is_not(None))
            .exists()
        )
        query = query.where(trained if f.outcome == "trained" else ~trained)
    return query


async def sessions_page(
    conn: AsyncConnection, f: SessionFilter, page: int, size: int
) -> tuple[list[SessionLine], bool]:
    """One page, newest first (index sessions.last_seen_at); the counts are per session of the
    page only (indexes on session_id), so a page costs the same with 100 or 100,000 sessions.
    Returns the lines and whether there is a next page."""
    s = m.Session
    ids = _filtered(f).order_by(s.last_seen_at.desc(), s.session_id).offset(page * size)
    page_ids = list((await conn.execute(ids.limit(size + 1))).scalars().all())
    return await lines_for(conn, page_ids[:size]), len(page_ids) > size


async def lines_for(conn: AsyncConnection, ids: list[str]) -> list[SessionLine]:
    """The sessions' lines, in the order given."""
    if not ids:
        return []
    s, j = m.Session, m.JudgementRow

    def per_session(column: Any, *where: Any) -> Any:
        table = column.table
        return (
            select(table.c.session_id, func.count())
            .where(table.c.session_id.in_(ids), *where)
            .group_by(table.c.session_id)
        )

    counts: dict[str, dict[str, int]] = {sid: {} for sid in ids}
    for name, query in {
        "turns": per_session(m.TurnRow.turn_id),
        "judged": per_session(j.judgement_id, j.judge_model.not_in(("", HELD_OUT))),
        "trained": per_session(m.SampleRow.sample_id, m.SampleRow.trained_in_step.is_not(None)),
    }.items():
        for sid, n in await conn.execute(query):
            counts[sid][name] = n
    rewards: dict[str, float] = {
        sid: reward
        for sid, reward in await conn.execute(
            select(m.SampleRow.session_id, func.avg(m.SampleRow.reward))
            .where(m.SampleRow.session_id.in_(ids))
            .group_by(m.SampleRow.session_id)
        )
    }
    rows = {
        r.session_id: r
        for r in await conn.execute(
            select(
                s.session_id,
                s.convention,
                func.coalesce(s.owner_key_hash, s.key_hash).label("key_hash"),
                s.started_at,
                s.last_seen_at,
                s.n_steps,
                s.train,
                s.status,
            ).where(s.session_id.in_(ids))
        )
    }
    return [
        SessionLine(
            sid,
            rows[sid].convention,
            rows[sid].key_hash,
            rows[sid].started_at,
            rows[sid].last_seen_at,
            rows[sid].n_steps,
            counts[sid].get("turns", 0),
            counts[sid].get("judged", 0),
            counts[sid].get("trained", 0),
            rewards.get(sid),
            rows[sid].train,
            rows[sid].status,
        )
        for sid in ids
        if sid in rows
    ]


@dataclass(frozen=True)
class Vote:
    score: int
    text: str


@dataclass
class TurnView:
    """One turn as the console shows it."""

    facts: TurnFacts
    version: int
    prompt_tail: list[dict[str, Any]]  # the prompt's last messages
    answer: dict[str, Any]  # the assistant message, tool calls included
    next_state: list[dict[str, Any]]
    votes: list[Vote] = field(default_factory=list)
    hint: str | None = None
    rewards: list[dict[str, Any]] = field(default_factory=list)  # every source's score
    feedback: int | None = None
    explicit_reward: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    held_out: bool = False

    @property
    def where(self) -> str:
        return "held out for the replay (never trained)" if self.held_out else why(self.facts)


@dataclass
class SessionView:
    line: SessionLine | None
    turns: list[TurnView]  # one page of them
    side_calls: list[dict[str, Any]]  # folded away: their prompts' last message and answer
    page: int = 0
    more: bool = False  # later turns on the next page


def _tail(messages: list[dict[str, Any]], n: int = 3) -> list[dict[str, Any]]:
    shown = [x for x in messages if x.get("role") not in ("system", "developer")]
    return shown[-n:]


def shown_next_state(step: dict[str, Any], following: dict[str, Any] | None) -> list[Any]:
    """What came after `step`'s answer in the `following` step (archived payloads), by the
    worker's rule (`claw_stream.next_state`)."""
    state = archived_next_state(step, following) if step else None
    return [x.model_dump(mode="json") for x in state.messages] if state else []


async def session_view(
    conn: AsyncConnection, session_id: str, page: int = 0, size: int = 20
) -> SessionView:
    """A session's `page`th `size` turns, in order, and the side calls made among them."""
    found = await lines_for(conn, [session_id])
    line = found[0] if found else None
    facts = {f.step_id: f for f in await turn_facts(conn, [session_id])}
    t, j, sp = m.TurnRow, m.JudgementRow, m.StepPayload
    nxt = sp.__table__.alias("following")
    fetched = await conn.execute(
        select(
            t.turn_id,
            t.step_id,
            m.StepRow.weight_version,
            m.StepRow.created_at,
            sp.payload.label("step"),
            nxt.c.payload.label("following"),
            j.judge_model,
            j.payload.label("judgement"),
            j.hint,
            j.feedback_score,
            j.explicit_reward,
        )
        .join(m.StepRow, m.StepRow.step_id == t.step_id)
        .outerjoin(sp, sp.step_id == t.step_id)
        .outerjoin(nxt, nxt.c.step_id == t.next_step_id)
        .outerjoin(j, j.turn_id == t.turn_id)
        .where(t.session_id == session_id)
        .order_by(t.turn_index)
        .offset(page * size)
        .limit(size + 1)
    )
    rows = list(fetched)
    following_page = rows[size] if len(rows) > size else None
    rows = rows[:size]
    samples: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for x in await conn.execute(
        select(
            m.SampleRow.turn_id,
            m.SampleRow.sample_id,
            m.SampleRow.method,
            m.SampleRow.reward,
            m.SampleRow.reward_source,
            m.SampleRow.status,
            m.SampleRow.trained_in_step,
        ).where(m.SampleRow.session_id == session_id)
    ):
        samples.setdefault(x.turn_id, []).append(dict(x._mapping))
    turns = []
    for r in rows:
        f = facts.get(r.step_id)
        step = r.step or {}
        request = step.get("request", {})
        judgement = r.judgement or {}
        if f is None:
            continue
        turns.append(
            TurnView(
                f,
                r.weight_version,
                _tail(request.get("messages", [])),
                step.get("response", {}).get("message", {}),
                shown_next_state(step, r.following),
                [
                    Vote(v, text)
                    for v, text in zip(
                        judgement.get("prm_votes", []), judgement.get("prm_raw", []), strict=False
                    )
                ],
                r.hint,
                judgement.get("rewards", []),
                r.feedback_score,
                r.explicit_reward,
                samples.get(r.turn_id, []),
                r.judge_model == HELD_OUT,
            )
        )
    among = [m.StepRow.session_id == session_id, m.StepRow.turn_type == "side"]
    if page > 0 and rows:  # the side calls made from this page's first turn on
        among.append(m.StepRow.created_at >= rows[0].created_at)
    if following_page is not None:  # and before the next page's
        among.append(m.StepRow.created_at < following_page.created_at)
    side = await conn.execute(
        select(m.StepRow.step_id, m.StepRow.weight_version, sp.payload)
        .join(sp, sp.step_id == m.StepRow.step_id)
        .where(and_(*among))
        .order_by(m.StepRow.created_at)
    )
    side_calls = [
        {
            "step_id": s.step_id,
            "version": s.weight_version,
            "asked": _tail(s.payload.get("request", {}).get("messages", []), 1),
            "answer": s.payload.get("response", {}).get("message", {}),
        }
        for s in side
    ]
    return SessionView(line, turns, side_calls, page, following_page is not None)


@dataclass(frozen=True)
class TrainingLine:
    step: int
    n_samples: int
    loss: float
    mean_reward: float | None
    approx_kl: float | None
    at: datetime


@dataclass
class VersionView:
    version: int
    status: str
    kind: str
    trainer_step: int | None
    ready_at: datetime | None
    rolled_back_from: int | None
    reason: str | None
    error: str | None
    has_checkpoint: bool
    serving: bool = False
    steps: list[TrainingLine] = field(default_factory=list)
    evals: list[tuple[str, float, int]] = field(default_factory=list)  # dataset, score, episodes
    replay: tuple[int, float] | None = None  # held-out turns, win rate against users' answers

    @property
    def samples(self) -> int:
        return sum(s.n_samples for s in self.steps)


async def versions(conn: AsyncConnection, policy: str) -> list[VersionView]:
    """Newest first; the serving one is the version announced ready last."""
    w = m.WeightVersion
    found = [
        VersionView(
            r.version,
            r.status,
            r.kind,
            r.trainer_step,
            r.ready_at,
            r.rolled_back_from,
            r.reason,
            r.error,
            bool(r.checkpoint_path),
        )
        for r in await conn.execute(select(w).where(w.policy == policy).order_by(w.version.desc()))
    ]
    by = {v.version: v for v in found}
    ready = [v for v in found if v.status == "ready" and v.ready_at is not None]
    if ready:
        max(ready, key=lambda v: v.ready_at or datetime.min).serving = True
    t = m.TrainingStep
    for version, step, n, loss, reward, kl, at in await conn.execute(
        select(t.version, t.step, t.n_samples, t.loss, t.mean_reward, t.approx_kl, t.created_at)
        .where(t.policy == policy)
        .order_by(t.step)
    ):
        if version in by:
            by[version].steps.append(TrainingLine(step, n, loss, reward, kl, at))
    e = m.EvalRun
    for version, dataset, score, episodes in await conn.execute(
        select(e.version, e.dataset, e.score, e.n_episodes)
        .where(e.policy == policy)
        .order_by(e.finished_at)
    ):
        if version in by:
            by[version].evals.append((dataset, score, episodes))
    x = m.ReplayResult
    won = func.avg(case((x.score > 0.5, 1.0), (x.score < 0.5, 0.0), else_=0.5))
    for version, n, rate in await conn.execute(
        select(x.version, func.count(), won).where(x.policy == policy).group_by(x.version)
    ):
        if version in by:
            by[version].replay = (n, float(rate))
    return found


@dataclass(frozen=True)
class Traffic:
    minutes: int
    steps: int
    turns: int
    samples: int
    trained: int
    sessions: int

    def per_minute(self, n: int) -> float:
        return n / self.minutes


async def traffic(conn: AsyncConnection, minutes: int = 5) -> Traffic:
    """The last `minutes`: steps, turns, samples made and samples trained (indexes on each
    created_at / updated_at); and how many sessions there are in all."""
    since = func.now() - func.make_interval(0, 0, 0, 0, 0, minutes)

    async def count(model: Any, column: Any, *where: Any) -> int:
        return int(
            await conn.scalar(
                select(func.count()).select_from(model).where(column >= since, *where)
            )
            or 0
        )

    return Traffic(
        minutes,
        await count(m.StepRow, m.StepRow.created_at),
        await count(m.TurnRow, m.TurnRow.created_at),
        await count(m.SampleRow, m.SampleRow.created_at),
        int(
            await conn.scalar(
                select(func.coalesce(func.sum(m.TrainingStep.n_samples), 0)).where(
                    m.TrainingStep.created_at >= since
                )
            )
            or 0
        ),
        int(await conn.scalar(select(func.count()).select_from(m.Session)) or 0),
    )
