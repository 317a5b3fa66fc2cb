"""Tables of the analytics store. No foreign keys: events of different topics arrive in any
order (at-least-once, several consumers), so rows reference each other by id and indexes only."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {
        dict[str, Any]: JSONB,
        list[Any]: JSONB,
        datetime: DateTime(timezone=True),
    }


class Timestamps:
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class Session(Base):
    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    group_id: Mapped[str | None] = mapped_column(String(256))
    convention: Mapped[str | None] = mapped_column(String(16), comment="api_key | path | header")
    key_hash: Mapped[str | None] = mapped_column(String(128), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="active", server_default="active")
    started_at: Mapped[datetime] = mapped_column(server_default=func.now())
    last_seen_at: Mapped[datetime] = mapped_column(server_default=func.now())
    ended_at: Mapped[datetime | None]
    end_reason: Mapped[str | None] = mapped_column(String(32))
    episode_reward: Mapped[float | None] = mapped_column(Float)
    n_steps: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    train: Mapped[bool] = mapped_column(
        Boolean,
        default=True,
        server_default="true",
        comment="False: its steps are archived, never judged or trained.",
    )
    owner_key_hash: Mapped[str | None] = mapped_column(
        String(128),
        index=True,
        comment="The key the session was bound to, kept after the key moved on "
        "(forget --key finds every session of a key).",
    )
    tenant: Mapped[str | None] = mapped_column(
        String(64),
        index=True,
        comment="The tenant its key was started for (tenants.py); null: none.",
    )

    # the console lists sessions newest first (0013)
    __table_args__ = (Index(None, "status", "last_seen_at"), Index(None, "last_seen_at"))


class StartRequest(Base, Timestamps):
    """AReaL's `request_id` on `/rl/start_session`: a retry gets the first call's answer."""

    __tablename__ = "start_requests"

    request_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    body_hash: Mapped[str] = mapped_column(
        String(64), comment="SHA-256 of the request's fields: a retry must send the same body."
    )
    answer: Mapped[dict[str, Any] | None] = mapped_column(
        comment="What the first call answered, without keys (they are derived again)."
    )


class SessionHead(Base):
    """Where a session's main line stands: a call with no session id whose messages start with
    a head joins that session (`gateway/sessions/main_lines.py`)."""

    __tablename__ = "session_heads"

    head: Mapped[bytes] = mapped_column(
        LargeBinary,
        primary_key=True,
        comment="Hash of a main line's messages through its last answer.",
    )
    session_id: Mapped[str] = mapped_column(String(256))
    seen_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (Index(None, "seen_at"),)


class StepRow(Base, Timestamps):
    __tablename__ = "steps"

    step_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256))
    group_id: Mapped[str | None] = mapped_column(String(256))
    turn_type: Mapped[str] = mapped_column(String(8))
    turn_index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(Text)
    weight_version: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    n_tool_calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    latency_ms: Mapped[float] = mapped_column(Float)
    train: Mapped[bool] = mapped_column(Boolean, default=True, server_default="true")
    tenant: Mapped[str | None] = mapped_column(
        String(64), index=True, comment="Whose agent the call served (tenants.py); null: none."
    )

    __table_args__ = (
        Index(None, "session_id", "turn_index"),
        Index(None, "weight_version"),
        Index(None, "created_at"),  # the console's traffic of the last minutes (0013)
    )


class StepPayload(Base, Timestamps):
    """The full Step event, so replay works after the memory-only broker restarted."""

    __tablename__ = "step_payloads"

    step_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256))
    payload: Mapped[dict[str, Any]]

    __table_args__ = (Index(None, "created_at"),)


class SessionEventRow(Base, Timestamps):
    __tablename__ = "session_events"

    event_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    step_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    reward: Mapped[float | None] = mapped_column(Float)
    score: Mapped[int | None] = mapped_column(Integer)
    text: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[dict[str, Any]]
    segment: Mapped[int] = mapped_column(
        Integer,
        default=0,
        server_default="0",
        comment="The session's segment (episode) open when it arrived.",
    )

    __table_args__ = (Index(None, "session_id", "created_at"), Index(None, "created_at"))


class TurnRow(Base, Timestamps):
    __tablename__ = "turns"

    turn_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256))
    step_id: Mapped[uuid.UUID] = mapped_column(Uuid, unique=True)
    turn_index: Mapped[int] = mapped_column(Integer)
    next_step_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    has_next_state: Mapped[bool] = mapped_column(Boolean)
    closed_reason: Mapped[str] = mapped_column(String(16))
    is_last: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    segment: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    token_drift: Mapped[str | None] = mapped_column(
        Text, comment="Where its prompt ids part from the previous turn's (never trained)."
    )

    __table_args__ = (Index(None, "session_id", "turn_index"), Index(None, "created_at"))


class JudgementRow(Base, Timestamps):
    __tablename__ = "judgements"

    judgement_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    turn_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    session_id: Mapped[str] = mapped_column(String(256))
    step_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    judge_model: Mapped[str] = mapped_column(Text)
    prm_score: Mapped[int | None] = mapped_column(Integer)
    prm_votes: Mapped[list[Any]]
    hint: Mapped[str | None] = mapped_column(Text)
    n_hint_votes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    has_teacher: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    explicit_reward: Mapped[float | None] = mapped_column(Float)
    feedback_score: Mapped[int | None] = mapped_column(Integer)
    payload: Mapped[dict[str, Any] | None] = mapped_column(
        comment="The Judgement event; the worker assembles a session's samples from these."
    )
    segment: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    sampled_at: Mapped[datetime | None] = mapped_column(
        comment="When its turn's own sample was assembled (per_turn) or its segment's (per_episode)."
    )
    history_cut: Mapped[int] = mapped_column(
        Integer,
        default=0,
        server_default="0",
        comment="Messages of the oldest history left out of the judge prompt to fit its context.",
    )

    __table_args__ = (
        Index(None, "turn_id"),
        Index(None, "session_id"),
        Index(None, "sampled_at", "created_at"),
    )


class SampleRow(Base, Timestamps):
    __tablename__ = "samples"

    sample_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    topic: Mapped[str] = mapped_column(
        String(249), default="claw.samples", server_default="claw.samples"
    )
    session_id: Mapped[str] = mapped_column(String(256))
    group_id: Mapped[str | None] = mapped_column(String(256))
    step_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    turn_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    method: Mapped[str] = mapped_column(String(8))
    reward: Mapped[float] = mapped_column(Float)
    reward_source: Mapped[str] = mapped_column(String(16))
    weight_version: Mapped[int] = mapped_column(Integer)
    released_at_version: Mapped[int] = mapped_column(Integer)
    n_prompt_tokens: Mapped[int] = mapped_column(Integer)
    n_response_tokens: Mapped[int] = mapped_column(Integer)
    trained_in_step: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(
        String(16),
        default="published",
        server_default="published",
        comment="held | pending | published | dropped (stale) | no_signal",
    )
    payload: Mapped[dict[str, Any] | None] = mapped_column(
        comment="The Sample event as published (the outbox): re-sent byte for byte after a crash."
    )
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (
        Index(None, "session_id"),
        Index(None, "weight_version"),
        Index(None, "status", "updated_at"),
        Index(None, "turn_id"),
        Index(None, "created_at"),
    )


class PipelineSession(Base):
    """The stitcher's per-session state, kept where a worker crash cannot drop it."""

    __tablename__ = "pipeline_sessions"

    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    last_step_at: Mapped[datetime | None]
    end_reason: Mapped[str | None] = mapped_column(String(16))
    end_n_steps: Mapped[int | None] = mapped_column(
        Integer, comment="Steps the gateway counted when the session ended; close waits for them."
    )
    end_requested_at: Mapped[datetime | None]
    closed_at: Mapped[datetime | None] = mapped_column(comment="When its last turn was emitted.")
    assembled_at: Mapped[datetime | None]
    n_samples: Mapped[int | None] = mapped_column(Integer)
    segment: Mapped[int] = mapped_column(
        Integer,
        default=0,
        server_default="0",
        comment="The open (or last closed) segment: steps after a close open the next one.",
    )
    n_steps: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0", comment="Steps placed, all segments."
    )

    __table_args__ = (
        Index(None, "closed_at", "last_step_at"),
        Index(None, "assembled_at", "closed_at"),
    )


class JudgeRetry(Base):
    """A turn the judge could not answer in time (a timeout, a busy or unreachable server):
    judged again with backoff until `worker.judge_give_up_after_s`, then dead-lettered with
    the reason. A row that gave up stays, so `doctor` can say why the turn has no sample."""

    __tablename__ = "judge_retries"

    turn_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256))
    payload: Mapped[dict[str, Any]] = mapped_column(comment="The Turn event, judged again.")
    attempts: Mapped[int] = mapped_column(Integer)
    first_failed_at: Mapped[datetime] = mapped_column(server_default=func.now())
    next_at: Mapped[datetime] = mapped_column(server_default=func.now())
    last_error: Mapped[str] = mapped_column(Text)
    gave_up_at: Mapped[datetime | None]

    __table_args__ = (Index(None, "next_at"), Index(None, "session_id"))


class PipelineSegment(Base):
    """One episode of a session: the steps between a start (or a resume) and a close."""

    __tablename__ = "pipeline_segments"

    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    segment: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(server_default=func.now())
    closed_at: Mapped[datetime | None]
    close_reason: Mapped[str | None] = mapped_column(String(16))
    tail_step_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid,
        comment="per_turn idle close: the last main step, stitched with the next segment's "
        "first main step (its next state) or judged without one after tail_timeout_s.",
    )
    assembled_at: Mapped[datetime | None]
    n_samples: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (Index(None, "assembled_at", "closed_at"),)


class PipelineStep(Base):
    """Where the stitcher placed a step: its segment and its turn type as classified."""

    __tablename__ = "pipeline_steps"

    step_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256))
    segment: Mapped[int] = mapped_column(Integer)
    turn_index: Mapped[int] = mapped_column(Integer)
    turn_type: Mapped[str] = mapped_column(String(8), comment="main | side, as classified")
    classified_by: Mapped[str] = mapped_column(
        String(16), comment="header | first | extends | same_prompt | other_prompt"
    )
    step_created_at: Mapped[datetime]
    token_drift: Mapped[str | None] = mapped_column(
        Text,
        comment="Where its prompt ids part from the previous main step's prompt and answer ids.",
    )
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (Index(None, "session_id", "segment"),)


class WeightVersion(Base):
    __tablename__ = "weight_versions"

    policy: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(8))
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    adapter_name: Mapped[str | None] = mapped_column(Text)
    trainer_step: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    rolled_back_from: Mapped[int | None] = mapped_column(
        Integer, comment="Served again by a rollback from this version"
    )
    reason: Mapped[str | None] = mapped_column(Text, comment="Why it was rolled back to")
    updating_at: Mapped[datetime | None]
    ready_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]


class TrainingStep(Base, Timestamps):
    __tablename__ = "training_steps"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    policy: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(8))
    n_samples: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float] = mapped_column(Float)
    mean_reward: Mapped[float | None] = mapped_column(Float)
    clip_fraction: Mapped[float | None] = mapped_column(Float)
    approx_kl: Mapped[float | None] = mapped_column(Float)
    is_weight_mean: Mapped[float | None] = mapped_column(Float)
    is_weight_max: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    n_trained_tokens: Mapped[int | None] = mapped_column(
        Integer, comment="Answer tokens trained; n_tokens / n_trained_tokens: tokens per trained"
    )
    n_unpacked: Mapped[int | None] = mapped_column(
        Integer, comment="Samples that could not join their session's packed sequence"
    )
    extra: Mapped[dict[str, Any] | None] = mapped_column(
        comment="Metrics a user loss returned (trainer.loss), by name"
    )
    n_groups: Mapped[int | None] = mapped_column(
        Integer, comment="Groups of several trajectories whose rewards were normalised together"
    )

    __table_args__ = (UniqueConstraint("policy", "step"),)


class ForgottenSession(Base):
    """A session someone asked to forget: every row of it was deleted; only its id stays, so
    that the worker, replay and the trainer never take it in again."""

    __tablename__ = "forgotten_sessions"

    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    forgotten_at: Mapped[datetime] = mapped_column(server_default=func.now())
    removed: Mapped[dict[str, Any]] = mapped_column(comment="Rows deleted per table.")


class ForgottenTenant(Base):
    """A tenant someone asked to forget: the trainer deletes its adapter's checkpoints, then
    this row (its sessions are forgotten as any others)."""

    __tablename__ = "forgotten_tenants"
    __table_args__ = {
        "comment": "A tenant someone asked to forget: the trainer deletes its adapter's "
        "checkpoints, then this row."
    }

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    forgotten_at: Mapped[datetime] = mapped_column(server_default=func.now())


class EvalRun(Base):
    """One version's score in one held-out evaluation run (`claw-stream eval`)."""

    __tablename__ = "eval_runs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64))
    policy: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    dataset: Mapped[str] = mapped_column(Text)
    agent: Mapped[str] = mapped_column(String(16))
    n_tasks: Mapped[int] = mapped_column(Integer)
    n_episodes: Mapped[int] = mapped_column(Integer)
    n_passed: Mapped[int] = mapped_column(Integer)
    n_failed: Mapped[int] = mapped_column(Integer, comment="Episodes that could not be scored")
    score: Mapped[float] = mapped_column(Float, comment="Share of scored episodes that passed")
    mean_reward: Mapped[float] = mapped_column(Float)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]

    __table_args__ = (Index(None, "policy", "dataset", "version"),)


class HeldOutResult(Base):
    """One version's score on one held-out item: a question of the demo's held-out set, a task
    of an eval run. `claw-stream report` pairs two versions' scores item by item for the win
    rate of one against the other."""

    __tablename__ = "held_out_results"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(
        String(256), comment="persona | tasks:<dataset>: who scored it, by which rule"
    )
    policy: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    item: Mapped[str] = mapped_column(String(256), comment="The question or task, within source")
    score: Mapped[float] = mapped_column(Float, comment="Higher is better: 1 pass, 0 fail")
    session_id: Mapped[str | None] = mapped_column(
        String(256), comment="The session its side call was filed under"
    )
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (UniqueConstraint("source", "policy", "version", "item"),)


class ReplayResult(Base):
    """A held-out turn (held out of training, `eval.holdout_share`) answered again by a version
    and scored against the answer the user got: by a rule where one scores the turns (the
    persona's, a task's checker), else by a judge voting in both orders. Both are kept where
    both scored, so the judge's agreement with the rule can be measured."""

    __tablename__ = "replay_results"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    policy: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer, comment="The version that answered again")
    turn_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    session_id: Mapped[str] = mapped_column(String(256), comment="The user's session")
    key_hash: Mapped[str | None] = mapped_column(String(128), comment="The user's key, hashed")
    served_version: Mapped[int] = mapped_column(
        Integer, comment="The version whose answer the user got"
    )
    scorer: Mapped[str] = mapped_column(String(256), comment="rule:<name> | judge:<model>")
    score: Mapped[float] = mapped_column(
        Float, comment="The new answer's: 1 it wins, 0.5 a tie, 0 it loses"
    )
    rule_score: Mapped[float | None] = mapped_column(Float)
    judge_score: Mapped[float | None] = mapped_column(
        Float, comment="The mean of the judge's votes, both orders"
    )
    judge: Mapped[str | None] = mapped_column(Text, comment="The judge model that voted")
    n_votes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    answer: Mapped[str] = mapped_column(Text, comment="The new answer")
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (UniqueConstraint("policy", "version", "turn_id"),)


class Skill(Base):
    """A lesson the gateway adds to its users' prompts (`claw_stream/skills/`): learned from a
    correction, a feedback text, a judge's hint or a console label, confirmed each time a user
    teaches it again."""

    __tablename__ = "skills"

    skill_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    scope: Mapped[str] = mapped_column(
        String(160), comment="tenant:<name> | key:<key hash> | anonymous | policy (everyone)"
    )
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(
        String(16), comment="correction | feedback | hint | label | admin: how it was first taught"
    )
    state: Mapped[str] = mapped_column(
        String(8), default="active", server_default="active", comment="active | pinned | retired"
    )
    confirmations: Mapped[int] = mapped_column(
        Integer, default=1, server_default="1", comment="Times it was taught, the first included"
    )
    teachers: Mapped[list[Any]] = mapped_column(
        comment="The user scopes that taught it (a policy skill: at least promote_min_users)"
    )
    provenance: Mapped[list[Any]] = mapped_column(
        comment="The turns it came from, newest last: session_id, step_id, turn_id, source"
    )
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (Index(None, "scope", "state"),)
