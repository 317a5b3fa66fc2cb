"""worker state: per-session stitch state, sample outbox, judgement payloads

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pipeline_sessions",
        sa.Column("session_id", sa.String(length=256), nullable=False),
        sa.Column("last_step_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=16), nullable=True),
        sa.Column(
            "end_n_steps",
            sa.Integer(),
            nullable=True,
            comment="Steps the gateway counted when the session ended; close waits for them.",
        ),
        sa.Column("end_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "closed_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="When its last turn was emitted.",
        ),
        sa.Column("assembled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("n_samples", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_pipeline_sessions")),
    )
    op.create_index(
        op.f("ix_pipeline_sessions_closed_at_last_step_at"),
        "pipeline_sessions",
        ["closed_at", "last_step_at"],
    )
    op.create_index(
        op.f("ix_pipeline_sessions_assembled_at_closed_at"),
        "pipeline_sessions",
        ["assembled_at", "closed_at"],
    )
    op.add_column(
        "judgements",
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=True,
            comment="The Judgement event; the worker assembles a session's samples from these.",
        ),
    )
    op.add_column(
        "samples",
        sa.Column(
            "status",
            sa.String(length=16),
            server_default="published",
            nullable=False,
            comment="held | pending | published | dropped (stale) | no_signal",
        ),
    )
    op.add_column(
        "samples",
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=True,
            comment="The Sample event as published (the outbox): re-sent byte for byte after a crash.",
        ),
    )
    op.add_column(
        "samples",
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index(op.f("ix_samples_status_updated_at"), "samples", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_samples_status_updated_at"), table_name="samples")
    op.drop_column("samples", "updated_at")
    op.drop_column("samples", "payload")
    op.drop_column("samples", "status")
    op.drop_column("judgements", "payload")
    op.drop_index(
        op.f("ix_pipeline_sessions_assembled_at_closed_at"), table_name="pipeline_sessions"
    )
    op.drop_index(
        op.f("ix_pipeline_sessions_closed_at_last_step_at"), table_name="pipeline_sessions"
    )
    op.drop_table("pipeline_sessions")
