"""Reads of the analytics views (migration 0003) for `claw-stream stats` and the demo."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from claw_stream.store.db import make_engine

QUERIES = {
    "reward per version": (
        "SELECT weight_version AS version, n_sessions, n_steps, n_samples, mean_reward,"
        " share_positive, mean_completion_tokens AS mean_tokens, n_dropped_stale"
        " FROM reward_per_version ORDER BY weight_version"
    ),
    "training curve": (
        "SELECT step, version, n_samples, loss, mean_reward, clip_fraction, approx_kl,"
        " tokens_per_s, step_time_s FROM training_curve ORDER BY step DESC LIMIT :limit"
    ),
    "eval score per version": (
        "SELECT dataset, version, score, change, mean_reward, n_episodes, n_failed, finished_at"
        " FROM eval_scores ORDER BY dataset, version"
    ),
    "episodes": (
        "SELECT session_id, segment, n_steps, n_side_steps AS n_side, n_turns, n_samples,"
        " mean_reward, mean_prm, judge_agreement, n_feedback, first_version, last_version,"
        " end_reason, n_not_considered FROM episodes ORDER BY started_at DESC LIMIT :limit"
    ),
}


async def read_stats(database_url: str, limit: int = 20) -> dict[str, list[dict[str, Any]]]:
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            return {
                name: [dict(r._mapping) for r in await conn.execute(text(sql), {"limit": limit})]
                for name, sql in QUERIES.items()
            }
    finally:
        await engine.dispose()
