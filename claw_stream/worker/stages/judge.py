"""The judge stage: each turn judged by the reward sources (the PRM among them) once; a turn
whose judge is busy or timed out kept in judge_retries and judged again with backoff."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from claw_stream.events import (
    Event,
    Turn,
    encode_event,
)
from claw_stream.ids import judgement_id_of
from claw_stream.store import consent
from claw_stream.worker.judge_client import JudgeClient
from claw_stream.worker.reward_sources import session_metadata as merged_metadata
from claw_stream.worker.stages.io import INFRA_ERRORS, Record, WorkerIO
from claw_stream.worker.state import archive, judge_retries, outbox

log = logging.getLogger(__name__)


class Judger:
    name = "judge"

    def __init__(self, io: WorkerIO):
        self.io = io
        self.judge_client: JudgeClient | None = None
        self._turn_facts: dict[uuid.UUID, list[str] | None] = {}  # None: judged already
        self._turns_off: dict[uuid.UUID, bool] = {}  # whether a turn's session is switched off
        self._judging_again: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.judge_client = client = JudgeClient(self.io.config, self.io.prompts, self.io.sources)
        self.io.metrics.judge_in_flight.set_function(lambda: client.in_flight)

    async def stop(self) -> None:
        for task in list(self._judging_again):
            task.cancel()
        if self.judge_client is not None:
            await self.judge_client.aclose()

    async def prefetch_turns(self, records: list[Record]) -> dict[int, Event]:
        """Which turns of a batch were judged already, what feedback text each has and whether
        its session is switched off, in three queries for the batch instead of three
        transactions per turn (`on_turn` falls back to its own). The turns that decode, by
        id(record)."""
        decoded: dict[int, Event] = {}
        for r in records:
            turns = self.io.decode_all([r])  # a bad one is left to `handle`
            if turns:
                decoded[id(r)] = turns[0]
        found = [t for t in decoded.values() if isinstance(t, Turn)]
        if not found:
            return decoded
        try:
            async with self.io.db.connect() as conn:
                facts = await archive.turn_facts(conn, found)
                off = await consent.untrainable(conn, {t.session_id for t in found})
        except INFRA_ERRORS:
            return decoded
        self._turn_facts.update(facts)
        self._turns_off.update({t.turn_id: t.session_id in off for t in found})
        return decoded

    async def on_turn(self, turn: Turn) -> bool:
        """Judge a turn; False when the judge could not answer and it was kept for later."""
        off = self._turns_off.pop(turn.turn_id, None)
        if turn.turn_id in self._turn_facts:
            facts = self._turn_facts.pop(turn.turn_id)
            if facts is None:
                return True  # redelivered: judged already
            feedback = facts
        else:
            async with self.io.db.connect() as conn:
                if await archive.judged(conn, judgement_id_of(turn.turn_id)):
                    return True  # redelivered: judged already
                feedback = await outbox.feedback_texts(conn, turn)
        if turn.token_drift is not None:
            self.io.metrics.token_drift.labels(self.io.config.token_drift).inc()
            log.info("turn %s: %s", turn.turn_id, turn.token_drift)
        if turn.token_drift is not None and self.io.config.token_drift == "drop":
            async with self.io.db.begin() as conn:
                await archive.skip_judging(conn, [(turn, judgement_id_of(turn.turn_id))])
            await self.io.dead_letter(
                "judge",
                self.io.topics.turns,
                encode_event(turn),
                RuntimeError(turn.token_drift),
                key=turn.session_id,
            )
            return True
        if off is None:
            async with self.io.db.connect() as conn:
                off = bool(await consent.untrainable(conn, [turn.session_id]))
        if off:
            # switched off (or forgotten) after the turn was stitched: never judged
            async with self.io.db.begin() as conn:
                await archive.skip_judging(conn, [(turn, judgement_id_of(turn.turn_id))])
            self.io.metrics.untrained.labels("session").inc()
            return True
        metadata: dict[str, Any] = {}
        if self.io.sources:
            async with self.io.db.connect() as conn:
                metadata = merged_metadata(await outbox.session_events(conn, turn.session_id))
        assert self.judge_client is not None
        with self.io.metrics.judge_seconds.time():
            outcome = await self.judge_client.judge(turn, feedback, metadata)
        if outcome.judgement.history_cut:
            self.io.metrics.judge_prompts_cut.inc()
        if outcome.errors:
            self.io.metrics.judge_errors.inc(len(outcome.errors))
            self.io.metrics.judge_timeouts.inc(outcome.timeouts)
            error = "; ".join(outcome.errors)[:4000]
            if outcome.busy:
                async with self.io.db.begin() as conn:
                    kept = await judge_retries.defer_judging(conn, turn, error, self._backoff)
                    if kept.waited_s < self.io.config.judge_give_up_after_s:
                        self.io.metrics.judge_deferred.inc()
                        log.info(
                            "judge busy on turn %s (attempt %d): judged again later: %s",
                            turn.turn_id,
                            kept.attempts,
                            error[:200],
                        )
                        return False
                    await judge_retries.give_up_judging(conn, turn.turn_id)
                self.io.metrics.judge_gave_up.inc()
                error = (
                    f"judge_unavailable: no answer in {kept.waited_s:.0f} s, {kept.attempts} "
                    f"attempts (worker.judge_give_up_after_s): {error}"
                )[:4000]
            await self.io.dead_letter(
                "judge",
                self.io.topics.turns,
                encode_event(turn),
                RuntimeError(error),
                key=turn.session_id,
            )
        await self.io.emit(self.io.topics.judgements, turn.session_id, outcome.judgement)
        return True

    def _backoff(self, attempts: int) -> float:
        """Seconds before a kept turn is judged again: 5, 10, 20, ... up to the maximum."""
        return min(self.io.config.judge_backoff_max_s, 5.0 * 2 ** min(attempts - 1, 16))

    async def judge_again(self) -> None:
        """Start judging kept turns whose time has come, in the background: a judge that
        takes minutes must not hold up the sweeper's other work."""
        c = self.io.config
        room = c.judge_concurrency - len(self._judging_again)
        if room > 0:
            # leased for as long as one judging may take (every request, every retry)
            lease = c.judge_timeout_s * (c.judge_retries + 1) * 3 + 60
            async with self.io.db.begin() as conn:
                due = await judge_retries.judging_due(conn, lease, room)
            for turn in due:
                task = asyncio.create_task(self._judge_kept(turn))
                self._judging_again.add(task)
                task.add_done_callback(self._judging_again.discard)
        async with self.io.db.connect() as conn:
            self.io.metrics.judge_waiting.set(await judge_retries.judging_waiting(conn))

    async def _judge_kept(self, turn: Turn) -> None:
        try:
            if await self.on_turn(turn):
                async with self.io.db.begin() as conn:
                    await judge_retries.judged_again(conn, turn.turn_id)
        except Exception:
            log.exception("judging kept turn %s again failed; its lease runs out", turn.turn_id)
