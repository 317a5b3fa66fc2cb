"""Held-out scores per version and item in Postgres (table `held_out_results`, view
`held_out_by_version`): the demo's questions and the eval's tasks write them, `claw-stream
report` reads them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from claw_stream.store.db import make_engine
from claw_stream.store.models import HeldOutResult


@dataclass(frozen=True)
class ItemScore:
    source: str  # persona | tasks:<dataset>
    version: int
    item: str
    score: float  # higher is better, 1 a pass
    session_id: str | None = None


async def save_item_scores(database_url: str, policy: str, scores: Iterable[ItemScore]) -> int:
    """Kept once per (source, version, item): a set scored again adds nothing."""
    rows = [{"policy": policy, **asdict(s)} for s in scores]
    if not rows:
        return 0
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            done = await conn.execute(
                insert(HeldOutResult)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["source", "policy", "version", "item"])
            )
            return done.rowcount
    finally:
        await engine.dispose()


async def scores_by_version(
    database_url: str, policy: str, source: str
) -> dict[int, dict[str, float]]:
    """version -> item -> score, of one source."""
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            h = HeldOutResult
            rows = await conn.execute(
                select(h.version, h.item, h.score).where(h.policy == policy, h.source == source)
            )
            out: dict[int, dict[str, float]] = {}
            for version, item, score in rows:
                out.setdefault(version, {})[item] = score
            return out
    finally:
        await engine.dispose()
