"""turns the judge could not answer in time, judged again with backoff; token drift

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "judge_retries",
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="The Turn event, judged again.",
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column(
            "first_failed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "next_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("gave_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("turn_id", name=op.f("pk_judge_retries")),
    )
    op.create_index(op.f("ix_judge_retries_next_at"), "judge_retries", ["next_at"])
    op.create_index(op.f("ix_judge_retries_session_id"), "judge_retries", ["session_id"])
    op.add_column(
        "pipeline_steps",
        sa.Column(
            "token_drift",
            sa.Text(),
            nullable=True,
            comment="Where its prompt ids part from the previous main step's prompt and answer ids.",
        ),
    )
    op.add_column(
        "turns",
        sa.Column(
            "token_drift",
            sa.Text(),
            nullable=True,
            comment="Where its prompt ids part from the previous turn's (never trained).",
        ),
    )


def downgrade() -> None:
    op.drop_column("turns", "token_drift")
    op.drop_column("pipeline_steps", "token_drift")
    op.drop_table("judge_retries")
