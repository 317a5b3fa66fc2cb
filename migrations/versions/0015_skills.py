"""skills: the lessons the gateway adds to its users' prompts

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "skills",
        sa.Column("skill_id", sa.Uuid(), nullable=False),
        sa.Column(
            "scope",
            sa.String(160),
            nullable=False,
            comment="tenant:<name> | key:<key hash> | anonymous | policy (everyone)",
        ),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column(
            "source",
            sa.String(16),
            nullable=False,
            comment="correction | feedback | hint | label | admin: how it was first taught",
        ),
        sa.Column(
            "state",
            sa.String(8),
            server_default="active",
            nullable=False,
            comment="active | pinned | retired",
        ),
        sa.Column(
            "confirmations",
            sa.Integer(),
            server_default="1",
            nullable=False,
            comment="Times it was taught, the first included",
        ),
        sa.Column(
            "teachers",
            postgresql.JSONB(),
            nullable=False,
            comment="The user scopes that taught it (a policy skill: at least promote_min_users)",
        ),
        sa.Column(
            "provenance",
            postgresql.JSONB(),
            nullable=False,
            comment="The turns it came from, newest last: session_id, step_id, turn_id, source",
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("skill_id", name="pk_skills"),
    )
    op.create_index("ix_skills_scope_state", "skills", ["scope", "state"])


def downgrade() -> None:
    op.drop_index("ix_skills_scope_state", "skills")
    op.drop_table("skills")
