"""long-lived sessions: segments (episodes) of a session, placed steps, per-turn release

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One row per segment (episode) of a session, plus one per session for steps that were
# archived but never placed by the stitcher (segment NULL): those were not considered for
# training, and `n_not_considered` counts them (and main steps of a closed segment that never
# became a turn).
EPISODES = """
CREATE VIEW episodes AS
SELECT
    ps.session_id,
    ps.segment,
    min(st.created_at) AS started_at,
    g.closed_at,
    coalesce(g.close_reason, p.end_reason, s.end_reason) AS end_reason,
    count(*) AS n_steps,
    count(*) FILTER (WHERE ps.turn_type = 'main') AS n_main_steps,
    count(*) FILTER (WHERE ps.turn_type = 'side') AS n_side_steps,
    count(*) FILTER (WHERE ps.turn_type = 'side' AND ps.classified_by <> 'header')
        AS n_side_detected,
    (SELECT count(*) FROM turns t
      WHERE t.session_id = ps.session_id AND t.segment = ps.segment) AS n_turns,
    (SELECT count(*) FROM samples x JOIN turns t ON t.turn_id = x.turn_id
      WHERE t.session_id = ps.session_id AND t.segment = ps.segment
        AND x.status = 'published') AS n_samples,
    (SELECT avg(x.reward) FROM samples x JOIN turns t ON t.turn_id = x.turn_id
      WHERE t.session_id = ps.session_id AND t.segment = ps.segment
        AND x.status = 'published') AS mean_reward,
    (SELECT e.reward FROM session_events e
      WHERE e.session_id = ps.session_id AND e.segment = ps.segment
        AND e.kind = 'reward' AND e.step_id IS NULL
      ORDER BY e.created_at DESC LIMIT 1) AS episode_reward,
    (SELECT avg(j.prm_score) FROM judgements j
      WHERE j.session_id = ps.session_id AND j.segment = ps.segment) AS mean_prm,
    (SELECT avg(agree) FROM (
        SELECT (v.value::int = j.prm_score)::int AS agree
        FROM judgements j, jsonb_array_elements_text(j.prm_votes) AS v(value)
        WHERE j.session_id = ps.session_id AND j.segment = ps.segment
          AND j.prm_score IS NOT NULL
    ) a) AS judge_agreement,
    (SELECT count(*) FROM judgements j
      WHERE j.session_id = ps.session_id AND j.segment = ps.segment
        AND j.history_cut > 0) AS n_judge_prompts_cut,
    (SELECT count(*) FROM session_events e
      WHERE e.session_id = ps.session_id AND e.segment = ps.segment
        AND e.kind = 'feedback') AS n_feedback,
    min(st.weight_version) AS first_version,
    max(st.weight_version) AS last_version,
    avg(st.completion_tokens) AS mean_completion_tokens,
    count(*) FILTER (
        WHERE ps.turn_type = 'main' AND g.closed_at IS NOT NULL
          AND ps.step_id IS DISTINCT FROM g.tail_step_id
          AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.step_id = ps.step_id)
    ) AS n_not_considered
FROM pipeline_steps ps
JOIN steps st ON st.step_id = ps.step_id
LEFT JOIN pipeline_segments g ON g.session_id = ps.session_id AND g.segment = ps.segment
LEFT JOIN pipeline_sessions p ON p.session_id = ps.session_id
LEFT JOIN sessions s ON s.session_id = ps.session_id
GROUP BY ps.session_id, ps.segment, g.closed_at, g.close_reason, g.tail_step_id,
    p.end_reason, s.end_reason
UNION ALL
SELECT
    st.session_id, NULL, min(st.created_at), NULL, 'not_considered', count(*),
    count(*) FILTER (WHERE st.turn_type = 'main'), count(*) FILTER (WHERE st.turn_type = 'side'),
    0, 0, 0, NULL, NULL, NULL, NULL, 0, 0,
    min(st.weight_version), max(st.weight_version), avg(st.completion_tokens), count(*)
FROM steps st
WHERE NOT EXISTS (SELECT 1 FROM pipeline_steps ps WHERE ps.step_id = st.step_id)
GROUP BY st.session_id
"""

OLD_EPISODES = """
CREATE VIEW episodes AS
SELECT
    st.session_id,
    min(st.created_at) AS started_at,
    p.closed_at,
    coalesce(p.end_reason, s.end_reason) AS end_reason,
    count(*) AS n_steps,
    count(*) FILTER (WHERE st.turn_type = 'main') AS n_main_steps,
    (SELECT count(*) FROM turns t WHERE t.session_id = st.session_id) AS n_turns,
    (SELECT count(*) FROM samples x
      WHERE x.session_id = st.session_id AND x.status = 'published') AS n_samples,
    (SELECT avg(x.reward) FROM samples x
      WHERE x.session_id = st.session_id AND x.status = 'published') AS mean_reward,
    s.episode_reward,
    (SELECT avg(j.prm_score) FROM judgements j WHERE j.session_id = st.session_id) AS mean_prm,
    (SELECT avg(agree) FROM (
        SELECT (v.value::int = j.prm_score)::int AS agree
        FROM judgements j, jsonb_array_elements_text(j.prm_votes) AS v(value)
        WHERE j.session_id = st.session_id AND j.prm_score IS NOT NULL
    ) a) AS judge_agreement,
    (SELECT count(*) FROM session_events e
      WHERE e.session_id = st.session_id AND e.kind = 'feedback') AS n_feedback,
    min(st.weight_version) AS first_version,
    max(st.weight_version) AS last_version,
    avg(st.completion_tokens) AS mean_completion_tokens
FROM steps st
LEFT JOIN pipeline_sessions p ON p.session_id = st.session_id
LEFT JOIN sessions s ON s.session_id = st.session_id
GROUP BY st.session_id, p.closed_at, p.end_reason, s.end_reason, s.episode_reward
"""


def upgrade() -> None:
    op.add_column(
        "pipeline_sessions",
        sa.Column(
            "segment",
            sa.Integer(),
            server_default="0",
            nullable=False,
            comment="The open (or last closed) segment: steps after a close open the next one.",
        ),
    )
    op.add_column(
        "pipeline_sessions",
        sa.Column(
            "n_steps",
            sa.Integer(),
            server_default="0",
            nullable=False,
            comment="Steps placed, all segments.",
        ),
    )
    op.create_table(
        "pipeline_segments",
        sa.Column("session_id", sa.String(length=256), nullable=False),
        sa.Column("segment", sa.Integer(), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("close_reason", sa.String(length=16), nullable=True),
        sa.Column(
            "tail_step_id",
            sa.Uuid(),
            nullable=True,
            comment="per_turn idle close: the last main step, stitched with the next segment's "
            "first main step (its next state) or judged without one after tail_timeout_s.",
        ),
        sa.Column("assembled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("n_samples", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("session_id", "segment", name=op.f("pk_pipeline_segments")),
    )
    op.create_index(
        op.f("ix_pipeline_segments_assembled_at_closed_at"),
        "pipeline_segments",
        ["assembled_at", "closed_at"],
    )
    op.create_table(
        "pipeline_steps",
        sa.Column("step_id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.String(length=256), nullable=False),
        sa.Column("segment", sa.Integer(), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column(
            "turn_type", sa.String(length=8), nullable=False, comment="main | side, as classified"
        ),
        sa.Column(
            "classified_by",
            sa.String(length=16),
            nullable=False,
            comment="header | first | extends | same_prompt | other_prompt",
        ),
        sa.Column("step_created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("step_id", name=op.f("pk_pipeline_steps")),
    )
    op.create_index(
        op.f("ix_pipeline_steps_session_id_segment"), "pipeline_steps", ["session_id", "segment"]
    )
    for table in ("turns", "judgements", "session_events"):
        op.add_column(table, sa.Column("segment", sa.Integer(), server_default="0", nullable=False))
    op.alter_column(
        "session_events",
        "segment",
        comment="The session's segment (episode) open when it arrived.",
    )
    op.add_column(
        "judgements",
        sa.Column(
            "sampled_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="When its turn's own sample was assembled (per_turn) or its segment's "
            "(per_episode).",
        ),
    )
    op.add_column(
        "judgements",
        sa.Column(
            "history_cut",
            sa.Integer(),
            server_default="0",
            nullable=False,
            comment="Messages of the oldest history left out of the judge prompt to fit its "
            "context.",
        ),
    )
    op.create_index(
        op.f("ix_judgements_sampled_at_created_at"), "judgements", ["sampled_at", "created_at"]
    )
    op.create_index(op.f("ix_samples_turn_id"), "samples", ["turn_id"])
    # what the stitcher did before segments existed: every step in segment 0, as it came
    op.execute(
        "INSERT INTO pipeline_steps (step_id, session_id, segment, turn_index, turn_type,"
        " classified_by, step_created_at, created_at)"
        " SELECT step_id, session_id, 0, turn_index, turn_type, 'header', created_at, created_at"
        " FROM steps"
    )
    op.execute(
        "INSERT INTO pipeline_segments (session_id, segment, closed_at, close_reason,"
        " assembled_at, n_samples)"
        " SELECT session_id, 0, closed_at, end_reason, assembled_at, n_samples"
        " FROM pipeline_sessions"
    )
    op.execute(
        "UPDATE judgements SET sampled_at = now() WHERE session_id IN"
        " (SELECT session_id FROM pipeline_sessions WHERE assembled_at IS NOT NULL)"
    )
    op.execute("DROP VIEW IF EXISTS episodes")
    op.execute(EPISODES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS episodes")
    op.execute(OLD_EPISODES)
    op.drop_index(op.f("ix_samples_turn_id"), table_name="samples")
    op.drop_index(op.f("ix_judgements_sampled_at_created_at"), table_name="judgements")
    op.drop_column("judgements", "history_cut")
    op.drop_column("judgements", "sampled_at")
    for table in ("turns", "judgements", "session_events"):
        op.drop_column(table, "segment")
    op.drop_index(op.f("ix_pipeline_steps_session_id_segment"), table_name="pipeline_steps")
    op.drop_table("pipeline_steps")
    op.drop_index(
        op.f("ix_pipeline_segments_assembled_at_closed_at"), table_name="pipeline_segments"
    )
    op.drop_table("pipeline_segments")
    op.drop_column("pipeline_sessions", "n_steps")
    op.drop_column("pipeline_sessions", "segment")
