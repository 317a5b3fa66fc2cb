"""training steps say how many answer tokens they trained and how many samples did not pack

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "training_steps",
        sa.Column(
            "n_trained_tokens",
            sa.Integer(),
            nullable=True,
            comment="Answer tokens trained; n_tokens / n_trained_tokens: tokens per trained",
        ),
    )
    op.add_column(
        "training_steps",
        sa.Column(
            "n_unpacked",
            sa.Integer(),
            nullable=True,
            comment="Samples that could not join their session's packed sequence",
        ),
    )


def downgrade() -> None:
    op.drop_column("training_steps", "n_unpacked")
    op.drop_column("training_steps", "n_trained_tokens")
