"""tenants: sessions.tenant and steps.tenant (whose agent they served), forgotten_tenants

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column(
            "tenant",
            sa.String(64),
            nullable=True,
            comment="The tenant its key was started for (tenants.py); null: none.",
        ),
    )
    op.create_index("ix_sessions_tenant", "sessions", ["tenant"])
    op.add_column(
        "steps",
        sa.Column(
            "tenant",
            sa.String(64),
            nullable=True,
            comment="Whose agent the call served (tenants.py); null: none.",
        ),
    )
    op.create_index("ix_steps_tenant", "steps", ["tenant"])
    op.create_table(
        "forgotten_tenants",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column(
            "forgotten_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        comment="A tenant someone asked to forget: the trainer deletes its adapter's "
        "checkpoints, then this row.",
    )


def downgrade() -> None:
    op.drop_table("forgotten_tenants")
    op.drop_index("ix_steps_tenant", "steps")
    op.drop_column("steps", "tenant")
    op.drop_index("ix_sessions_tenant", "sessions")
    op.drop_column("sessions", "tenant")
