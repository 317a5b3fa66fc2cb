"""the held-out replay: each version's answers to held-out turns, scored against the answers
the users got; its win rate per version, per key and per session

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REPLAY_BY_VERSION = """
CREATE VIEW replay_by_version AS  -- each version against the answers users got, at 3 levels
SELECT policy, version, scorer,
       CASE WHEN grouping(key_hash) = 1 THEN 'all'
            WHEN grouping(session_id) = 1 THEN 'key' ELSE 'session' END AS level,
       key_hash, session_id, count(*) AS n_items,
       count(*) FILTER (WHERE score > 0.5) AS wins,
       count(*) FILTER (WHERE score = 0.5) AS ties,
       count(*) FILTER (WHERE score < 0.5) AS losses,
       avg(CASE WHEN score > 0.5 THEN 1.0 WHEN score < 0.5 THEN 0.0 ELSE 0.5 END) AS win_rate,
       min(created_at) AS first_at
FROM replay_results
GROUP BY GROUPING SETS ((policy, version, scorer), (policy, version, scorer, key_hash),
                        (policy, version, scorer, key_hash, session_id))
"""


def upgrade() -> None:
    op.create_table(
        "replay_results",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column(
            "version", sa.Integer(), nullable=False, comment="The version that answered again"
        ),
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False, comment="The user's session"),
        sa.Column("key_hash", sa.String(128), nullable=True, comment="The user's key, hashed"),
        sa.Column(
            "served_version",
            sa.Integer(),
            nullable=False,
            comment="The version whose answer the user got",
        ),
        sa.Column("scorer", sa.String(256), nullable=False, comment="rule:<name> | judge:<model>"),
        sa.Column(
            "score",
            sa.Float(),
            nullable=False,
            comment="The new answer's: 1 it wins, 0.5 a tie, 0 it loses",
        ),
        sa.Column("rule_score", sa.Float(), nullable=True),
        sa.Column(
            "judge_score",
            sa.Float(),
            nullable=True,
            comment="The mean of the judge's votes, both orders",
        ),
        sa.Column("judge", sa.Text(), nullable=True, comment="The judge model that voted"),
        sa.Column("n_votes", sa.Integer(), server_default="0", nullable=False),
        sa.Column("answer", sa.Text(), nullable=False, comment="The new answer"),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replay_results")),
        sa.UniqueConstraint(
            "policy", "version", "turn_id", name=op.f("uq_replay_results_policy_version_turn_id")
        ),
    )
    op.execute(REPLAY_BY_VERSION)


def downgrade() -> None:
    op.execute("DROP VIEW replay_by_version")
    op.drop_table("replay_results")
