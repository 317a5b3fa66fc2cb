"""each version's score on each held-out item, for the learning report's win rates; why a
version was rolled back to

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HELD_OUT_BY_VERSION = """
CREATE VIEW held_out_by_version AS  -- a version's held-out score, per source
SELECT source, policy, version, count(*) AS n_items, avg(score) AS mean_score,
       min(created_at) AS first_at
FROM held_out_results GROUP BY source, policy, version
"""


def upgrade() -> None:
    op.create_table(
        "held_out_results",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column(
            "source",
            sa.String(256),
            nullable=False,
            comment="persona | tasks:<dataset>: who scored it, by which rule",
        ),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "item", sa.String(256), nullable=False, comment="The question or task, within source"
        ),
        sa.Column("score", sa.Float(), nullable=False, comment="Higher is better: 1 pass, 0 fail"),
        sa.Column(
            "session_id",
            sa.String(256),
            nullable=True,
            comment="The session its side call was filed under",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_held_out_results")),
        sa.UniqueConstraint(
            "source",
            "policy",
            "version",
            "item",
            name=op.f("uq_held_out_results_source_policy_version_item"),
        ),
    )
    op.execute(HELD_OUT_BY_VERSION)
    op.add_column(
        "weight_versions",
        sa.Column(
            "rolled_back_from",
            sa.Integer(),
            nullable=True,
            comment="Served again by a rollback from this version",
        ),
    )
    op.add_column(
        "weight_versions",
        sa.Column("reason", sa.Text(), nullable=True, comment="Why it was rolled back to"),
    )


def downgrade() -> None:
    op.drop_column("weight_versions", "reason")
    op.drop_column("weight_versions", "rolled_back_from")
    op.execute("DROP VIEW held_out_by_version")
    op.drop_table("held_out_results")
