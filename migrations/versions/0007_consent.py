"""consent: sessions that may not be trained, and sessions forgotten

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column(
            "train",
            sa.Boolean(),
            server_default="true",
            nullable=False,
            comment="False: its steps are archived, never judged or trained.",
        ),
    )
    op.add_column(
        "sessions",
        sa.Column(
            "owner_key_hash",
            sa.String(length=128),
            nullable=True,
            comment="The key the session was bound to, kept after the key moved on "
            "(forget --key finds every session of a key).",
        ),
    )
    op.execute("UPDATE sessions SET owner_key_hash = key_hash WHERE key_hash IS NOT NULL")
    op.create_index(op.f("ix_sessions_owner_key_hash"), "sessions", ["owner_key_hash"])
    op.add_column(
        "steps",
        sa.Column("train", sa.Boolean(), server_default="true", nullable=False),
    )
    op.create_table(
        "forgotten_sessions",
        sa.Column("session_id", sa.String(length=256), nullable=False),
        sa.Column(
            "forgotten_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "removed",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="Rows deleted per table.",
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_forgotten_sessions")),
    )


def downgrade() -> None:
    op.drop_table("forgotten_sessions")
    op.drop_column("steps", "train")
    op.drop_index(op.f("ix_sessions_owner_key_hash"), table_name="sessions")
    op.drop_column("sessions", "owner_key_hash")
    op.drop_column("sessions", "train")
