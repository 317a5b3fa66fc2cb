"""the console's indexes: sessions newest first, and the traffic of the last minutes

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = [
    ("ix_sessions_last_seen_at", "sessions", ["last_seen_at"]),
    ("ix_steps_created_at", "steps", ["created_at"]),
    ("ix_turns_created_at", "turns", ["created_at"]),
    ("ix_samples_created_at", "samples", ["created_at"]),
]


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
