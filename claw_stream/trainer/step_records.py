"""A training step's row in training_steps, which step trained each of its samples, and the
samples taken in but not trained (`mark_untrained`), written so that an outage never stops
training. What weight_versions says of a policy is in `claw_stream/versions/`."""

from __future__ import annotations

import logging
import uuid
from typing import Literal

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from claw_stream.events import Sample
from claw_stream.store.db import until_database_back
from claw_stream.store.models import SampleRow, TrainingStep
from claw_stream.trainer.policy import StepMetrics

log = logging.getLogger(__name__)


async def record_step(
    db: async_sessionmaker[AsyncSession],
    policy: str,
    method: str,
    step: int,
    version: int,
    m: StepMetrics,
    batch: list[Sample],
) -> None:
    """Analytics: a failure is logged, never stops training; an outage is waited out."""
    row = {
        "policy": policy,
        "step": step,
        "version": version,
        "method": method,
        "n_samples": m.n_samples,
        "n_tokens": m.n_tokens,
        "loss": m.loss,
        "mean_reward": m.mean_reward,
        "clip_fraction": m.clip_fraction,
        "approx_kl": m.approx_kl,
        "is_weight_mean": m.is_weight_mean,
        "is_weight_max": m.is_weight_max,
        "tokens_per_s": m.tokens_per_s,
        "step_time_s": m.step_time_s,
        "n_trained_tokens": m.n_trained,
        "n_unpacked": m.n_unpacked,
        "extra": m.extra or None,
        "n_groups": m.n_groups,
    }
    statement = (
        insert(TrainingStep).values(**row).on_conflict_do_nothing(index_elements=["policy", "step"])
    )
    # which step trained each sample: the worker publishes again a sample the broker lost
    # before this trainer saw it (see `Assembler.resend_lost`)
    trained = (
        update(SampleRow)
        .where(SampleRow.sample_id.in_([s.sample_id for s in batch]))
        .values(trained_in_step=step)
    )
    try:  # a Postgres restart is waited out (the next step waits for it anyway)
        async for attempt in until_database_back(0, f"training step {step}'s record waits"):
            with attempt:
                async with db.begin() as session:
                    await session.execute(statement)
                    await session.execute(trained)
    except Exception as exc:
        log.warning("cannot record training step %d: %s", step, exc)


async def mark_untrained(
    db: async_sessionmaker[AsyncSession],
    sample_ids: list[uuid.UUID],
    status: Literal["withdrawn", "zero_advantage"],
) -> None:
    """Samples the trainer took in and will not train: their session was switched off or
    forgotten (`withdrawn`), or their group's rewards were all equal (`zero_advantage`). The
    step waits for Postgres, as long as it is unreachable."""
    async for attempt in until_database_back(what=f"recording samples {status} waits"):
        with attempt:
            async with db.begin() as session:
                await session.execute(
                    update(SampleRow)
                    .where(SampleRow.sample_id.in_(sample_ids))
                    .values(status=status)
                )
