"""start requests (AReaL's request_id makes /rl/start_session idempotent) and session heads
(a call without a session id joins the session whose main line it extends)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "start_requests",
        sa.Column("request_id", sa.String(length=256), nullable=False),
        sa.Column(
            "body_hash",
            sa.String(length=64),
            nullable=False,
            comment="SHA-256 of the request's fields: a retry must send the same body.",
        ),
        sa.Column(
            "answer",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=True,
            comment="What the first call answered, without keys (they are derived again).",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_start_requests")),
    )
    op.create_table(
        "session_heads",
        sa.Column(
            "head",
            postgresql.BYTEA(),
            nullable=False,
            comment="Hash of a main line's messages through its last answer.",
        ),
        sa.Column("session_id", sa.String(length=256), nullable=False),
        sa.Column(
            "seen_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("head", name=op.f("pk_session_heads")),
    )
    op.create_index(op.f("ix_session_heads_seen_at"), "session_heads", ["seen_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_session_heads_seen_at"), table_name="session_heads")
    op.drop_table("session_heads")
    op.drop_table("start_requests")
