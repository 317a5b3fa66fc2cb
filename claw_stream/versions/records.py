"""A version's row in weight_versions, written by one upsert with one rule (the trainer, the
promoter, `claw-stream rollback` and the worker archiving claw.weights all write through
`record`), and what weight_versions and eval_runs say of candidates, numbers and scores."""

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


async def record(conn: AsyncConnection, event: WeightEvent) -> None:
    """The version's row as this event leaves it: a field the event leaves out keeps its value,
    and a late 'updating' or 'candidate' never overwrites a decision (the worker archives
    every event again, in topic order, after its writer recorded it)."""
    stamp = WEIGHT_STAMPS[event.status]
    values = {
        "status": event.status,
        "kind": event.kind,
        "checkpoint_path": event.checkpoint_path,
        "adapter_name": event.adapter_name,
        "trainer_step": event.trainer_step,
        "error": event.error,
        "rolled_back_from": event.rolled_back_from,
        "reason": event.reason,
        stamp: event.created_at,
    }
    statement = insert(m.WeightVersion).values(policy=event.policy, version=event.version, **values)
    table = m.WeightVersion.__table__
    set_: dict[str, Any] = {
        k: func.coalesce(statement.excluded[k], table.c[k]) for k in values if k != "status"
    }
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


async def undecided(conn: AsyncConnection, policy: str, serving: int) -> set[int]:
    """Candidates newer than the serving version not yet promoted or rejected."""
    rows = await conn.execute(
        text(
            "SELECT version FROM weight_versions WHERE policy = :p AND status = 'candidate'"
            " AND version > :v"
        ),
        {"p": policy, "v": serving},
    )
    return {r for (r,) in rows}


async def newest_version(conn: AsyncConnection, policy: str) -> int:
    value = await conn.scalar(
        text("SELECT COALESCE(MAX(version), 0) FROM weight_versions WHERE policy = :p"),
        {"p": policy},
    )
    return int(value or 0)


async def checkpoint_of(conn: AsyncConnection, policy: str, version: int) -> str | None:
    return await conn.scalar(
        text("SELECT checkpoint_path FROM weight_versions WHERE policy = :p AND version = :v"),
        {"p": policy, "v": version},
    )


async def whole_score(
    conn: AsyncConnection, policy: str, version: int, dataset: str, episodes: int
) -> float | None:
    """The newest score of a version from a run over the whole dataset, if any."""
    return await conn.scalar(
        text(
            "SELECT score FROM eval_runs WHERE policy = :p AND version = :v AND dataset = :d"
            " AND n_episodes = :n ORDER BY finished_at DESC LIMIT 1"
        ),
        {"p": policy, "v": version, "d": dataset, "n": episodes},
    )
