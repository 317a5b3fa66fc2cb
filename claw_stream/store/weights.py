"""weight_versions rows from WeightEvents: the one upsert the worker (archiving claw.weights),
the trainer's announcements and `claw-stream rollback` share."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.events import WeightEvent
from claw_stream.store import models as m

# a candidate's announcement is stamped as an update's, a rejection as a failure's (no column
# of their own); the newest ready_at is the serving version (a rollback stamps it again)
WEIGHT_STAMPS = {
    "updating": "updating_at",
    "candidate": "updating_at",
    "ready": "ready_at",
    "failed": "failed_at",
    "rejected": "failed_at",
}


async def archive_weight(conn: AsyncConnection, event: WeightEvent) -> None:
    stamp = WEIGHT_STAMPS[event.status]
    values = {
        "status": event.status,
        "kind": event.kind,
        "checkpoint_path": event.checkpoint_path,
        "adapter_name": event.adapter_name,
        "trainer_step": event.trainer_step,
        "error": event.error,
        stamp: event.created_at,
    }
    statement = insert(m.WeightVersion).values(policy=event.policy, version=event.version, **values)
    table = m.WeightVersion.__table__
    set_: dict[str, Any] = {
        k: func.coalesce(statement.excluded[k], table.c[k]) for k in values if k != "status"
    }
    # a late 'updating' or 'candidate' never overwrites a decision
    set_["status"] = (
        text(
            "CASE WHEN weight_versions.status IN ('ready', 'failed', 'rejected')"
            " THEN weight_versions.status ELSE excluded.status END"
        )
        if event.status in ("updating", "candidate")
        else statement.excluded.status
    )
    await conn.execute(
        statement.on_conflict_do_update(index_elements=["policy", "version"], set_=set_)
    )
