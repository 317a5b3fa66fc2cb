"""analytics views: episodes, reward per version, training curve

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EPISODES = """
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

REWARD_PER_VERSION = """
CREATE VIEW reward_per_version AS
SELECT
    st.weight_version,
    count(DISTINCT st.session_id) AS n_sessions,
    count(*) AS n_steps,
    avg(st.completion_tokens) AS mean_completion_tokens,
    count(x.sample_id) AS n_samples,
    avg(x.reward) AS mean_reward,
    avg((x.reward > 0)::int) AS share_positive,
    count(*) FILTER (WHERE x.status = 'dropped') AS n_dropped_stale
FROM steps st
LEFT JOIN samples x ON x.step_id = st.step_id AND x.status IN ('published', 'dropped')
WHERE st.turn_type = 'main'
GROUP BY st.weight_version
"""

TRAINING_CURVE = """
CREATE VIEW training_curve AS
SELECT
    t.policy,
    t.step,
    t.version,
    t.created_at,
    t.n_samples,
    t.n_tokens,
    t.loss,
    t.mean_reward,
    t.clip_fraction,
    t.approx_kl,
    t.is_weight_mean,
    t.tokens_per_s,
    t.step_time_s,
    w.ready_at - w.updating_at AS push_time
FROM training_steps t
LEFT JOIN weight_versions w ON w.policy = t.policy AND w.version = t.version
"""


def upgrade() -> None:
    for statement in (EPISODES, REWARD_PER_VERSION, TRAINING_CURVE):
        op.execute(statement)


def downgrade() -> None:
    for view in ("training_curve", "reward_per_version", "episodes"):
        op.execute(f"DROP VIEW IF EXISTS {view}")
