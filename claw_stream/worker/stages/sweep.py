"""The sweeper: what time decides, on every worker at once (safe: every write is idempotent and
sessions are locked): idle sessions closed, tails closed, kept turns judged again, ready
segments assembled, held samples released, samples left pending or lost sent again."""

from __future__ import annotations

import logging
import time

from claw_stream.worker.stages.assemble import Assembler
from claw_stream.worker.stages.io import WorkerIO
from claw_stream.worker.stages.judge import Judger
from claw_stream.worker.stages.stitch import Stitcher
from claw_stream.worker.state import outbox, segments

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(self, io: WorkerIO, stitcher: Stitcher, judger: Judger, assembler: Assembler):
        self.io = io
        self.stitcher = stitcher
        self.judger = judger
        self.assembler = assembler
        self._lost_check_at = 0.0

    async def sweep(self) -> None:
        """Closes sessions by time, assembles what is ready, releases held samples and resends
        samples a dead worker left pending. Safe on every worker at once."""
        async with self.io.db.connect() as conn:
            due = await segments.sessions_to_sweep(
                conn, self.io.config.idle_timeout_s, self.io.config.reorder_grace_s
            )
        for session_id in due:
            await self.stitcher.advance(session_id)
        async with self.io.db.connect() as conn:
            tails = await segments.tails_due(conn, self.io.config.tail_timeout_s)
        for session_id in tails:
            await self.stitcher.close_tail(session_id)
        await self.judger.judge_again()
        self.io.ready.clear()  # this pass takes them all
        await self.assembler.release_pass(None)
        await self.assembler.release()
        async with self.io.db.begin() as conn:
            lost = await outbox.orphans(conn, self.io.config.orphan_after_s)
        if lost:
            # a worker died between publishing and marking: send only what is not there yet
            there = await self.assembler.on_topic({s.sample_id for s in lost})
            await outbox.mark_published(self.io.db, list(there))
            missing = [s for s in lost if s.sample_id not in there]
            log.info(
                "%d samples left pending by a stopped worker: %d resent", len(lost), len(missing)
            )
            await self.assembler.publish_samples(missing)
        if time.monotonic() >= self._lost_check_at:
            self._lost_check_at = time.monotonic() + self.io.config.lost_check_every_s
            await self.assembler.resend_lost()
