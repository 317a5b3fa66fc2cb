"""training steps say how many GRPO groups they normalised; eval runs and their view

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


EVAL_SCORES = """
CREATE VIEW eval_scores AS  -- per version: its fullest, then newest, run
SELECT policy, dataset, version, score, mean_reward, n_episodes, n_failed, finished_at,
    score - lag(score) OVER (PARTITION BY policy, dataset ORDER BY version) AS change
FROM (
    SELECT DISTINCT ON (policy, dataset, version) *
    FROM eval_runs ORDER BY policy, dataset, version, n_episodes DESC, finished_at DESC
) newest
"""


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=False),
        sa.Column("agent", sa.String(16), nullable=False),
        sa.Column("n_tasks", sa.Integer(), nullable=False),
        sa.Column("n_episodes", sa.Integer(), nullable=False),
        sa.Column("n_passed", sa.Integer(), nullable=False),
        sa.Column(
            "n_failed", sa.Integer(), nullable=False, comment="Episodes that could not be scored"
        ),
        sa.Column(
            "score", sa.Float(), nullable=False, comment="Share of scored episodes that passed"
        ),
        sa.Column("mean_reward", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    op.create_index(
        op.f("ix_eval_runs_policy_dataset_version"), "eval_runs", ["policy", "dataset", "version"]
    )
    op.execute(EVAL_SCORES)
    op.add_column(
        "training_steps",
        sa.Column(
            "n_groups",
            sa.Integer(),
            nullable=True,
            comment="Groups of several trajectories whose rewards were normalised together",
        ),
    )


def downgrade() -> None:
    op.execute("DROP VIEW eval_scores")
    op.drop_table("eval_runs")
    op.drop_column("training_steps", "n_groups")
