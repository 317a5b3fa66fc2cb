"""What weight_versions and eval_runs say of the serving version, its candidates and scores."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.serving.decide import ServingView

SERVING = (
    "SELECT version, checkpoint_path FROM weight_versions WHERE policy = :p"
    " AND ready_at IS NOT NULL ORDER BY ready_at DESC, version DESC LIMIT 1"
)


async def serving_view(conn: AsyncConnection, policy: str) -> ServingView:
    row = (await conn.execute(text(SERVING), {"p": policy})).first()
    serving, path = (int(row.version), row.checkpoint_path) if row else (0, None)
    newer = await conn.scalar(
        text(
            "SELECT count(*) FROM weight_versions WHERE policy = :p AND ready_at IS NOT NULL"
            " AND version > :v"
        ),
        {"p": policy, "v": serving},
    )
    rejected = await conn.execute(
        text("SELECT version FROM weight_versions WHERE policy = :p AND status = 'rejected'"),
        {"p": policy},
    )
    return ServingView(serving, path, bool(newer), frozenset(r for (r,) in rejected))


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
