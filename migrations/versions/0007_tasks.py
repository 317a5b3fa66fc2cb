"""training steps say how many GRPO groups they normalised

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
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
    op.drop_column("training_steps", "n_groups")
