"""The stitch stage: steps and session events, per session in order under its lock, placed on
the session's main line; new turns published to be judged; segments closed by an end, a
refresh or idleness (the sweeper's `advance`), held tails closed after `tail_timeout_s`."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.events import (
    SessionEvent,
    Step,
)
from claw_stream.ids import judgement_id_of
from claw_stream.store import consent
from claw_stream.store.locks import lock_sessions
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.logic.turns import (
    CloseReason,
    classify,
    close_reason,
    drifts_of,
    held_out,
    in_time_order,
    main_line,
    stitch_session,
    stitched_together,
)
from claw_stream.worker.stages.io import Record, WorkerIO, infra_retries
from claw_stream.worker.state import archive, outbox, segments
from claw_stream.worker.state.rows import Pair

log = logging.getLogger(__name__)


def close_decision(
    view: segments.StitchView, now: datetime, config: WorkerSettings
) -> CloseReason | None:
    """Whether a session closes now: ended with every counted step here (or waited long
    enough for missing ones), or idle."""
    if view.end_requested_at is not None:
        # the gateway counts a session's steps over all its segments
        complete = view.end_n_steps is None or max(view.n_steps, len(view.steps)) >= (
            view.end_n_steps
        )
        waited = (now - view.end_requested_at).total_seconds() >= config.reorder_grace_s
        if complete or waited:
            kind = "refreshed" if view.end_reason == "refreshed" else "ended"
            return close_reason(kind, view.end_reason)
        return None
    if view.last_step_at is None:
        return None
    idle_s = (now - view.last_step_at).total_seconds()
    return "idle_timeout" if idle_s >= config.idle_timeout_s else None


class Stitcher:
    name = "stitch"

    def __init__(self, io: WorkerIO):
        self.io = io

    async def _stitch_locked(
        self, conn: AsyncConnection, session_id: str, events: list[Step | SessionEvent]
    ) -> bool:
        """A session's records in order, under its lock; whether a segment closed."""
        closed_any = False
        view: segments.StitchView | None = None
        dirty = False
        for event in events:
            if isinstance(event, Step):
                await archive.archive_step(conn, event)
                placed = await segments.place_step(conn, event)
                if view is None or (placed is not None and placed[1]):
                    view = await segments.session_view(conn, session_id, self.io.steps)
                if view is None:  # archive_step made the row: only a foreign archive skips it
                    self.io.metrics.unconsidered.inc()
                    log.error("step %s of %s archived but not placed", event.step_id, session_id)
                elif placed is not None:
                    await self._place(conn, event, placed, view)
                dirty = True
                continue
            await segments.archive_event(conn, event)
            if event.kind in ("ended", "refreshed"):
                closed = await self._ended(conn, event)
                closed_any |= closed is not None
                view, dirty = None, False
            elif event.kind == "reward" and event.step_id is None:
                segment, _ = await segments.current_segment(conn, session_id)
                self.io.late.add((session_id, segment))
                self.io.ready.add(session_id)
        if dirty:
            closed = await self._advance(conn, session_id, view)
            closed_any |= closed is not None
        return closed_any

    async def stitch_one(self, event: Step | SessionEvent) -> None:
        """One record, as a batch of one (`stitch_batch` left it: it does not decode with its
        group, or the batch failed); the worker retries it and dead-letters it on its own."""
        closed = await self._stitch_sessions({event.session_id: [event]})
        # not `self.io.ready.update(await ...)`: a flush while it waits replaces the set
        self.io.ready.update(closed)

    async def stitch_batch(self, groups: list[list[Record]]) -> list[list[Record]]:
        """The sessions of a batch in one transaction (`_stitch_sessions`); the groups left to
        handle one by one: those with a record that does not decode or names another session
        than its group's (the bad one goes to the DLQ), all of them when the batch failed for
        another reason than the infrastructure."""
        sessions: dict[str, list[Step | SessionEvent]] = {}
        rest: list[list[Record]] = []
        for group in groups:
            events = self.io.decode_all(group)
            ids = {e.session_id for e in events or []}
            if events is None or len(ids) != 1 or ids & set(sessions):
                rest.append(group)
                continue
            sessions[ids.pop()] = in_time_order(events)
        if not sessions:
            return rest
        n = sum(len(events) for events in sessions.values())
        try:
            async for attempt in infra_retries():
                with attempt:
                    closed = await self._stitch_sessions(sessions)
        except Exception:
            log.exception("stitching %d records of %d sessions at once failed", n, len(sessions))
            return groups
        self.io.metrics.records.labels("stitch").inc(n)
        self.io.ready.update(closed)
        return rest

    async def _stitch_sessions(self, sessions: dict[str, list[Step | SessionEvent]]) -> set[str]:
        """Records of many sessions, each session's in order, under all their locks in one
        transaction; the sessions whose segment closed. Those whose records may close and
        reopen a segment go one by one (`_stitch_locked`), the others together.

        Per session and step, the statements of a stitch were most of the worker's time (the
        bench's stitch agent took ~0.8 s for a batch of 200 records); together, a batch costs
        about fifteen statements however many sessions it holds."""
        closed: set[str] = set()
        async with self.io.db.begin() as conn:
            ids = sorted(sessions)
            await lock_sessions(conn, ids)
            gone = await consent.forgotten(conn, ids)
            self.io.steps.drop_sessions(gone)
            self.io.own.drop_sessions(gone)
            for session_id in gone:
                self.io.metrics.forgotten.inc(len(sessions[session_id]))
            live = [s for s in ids if s not in gone]
            where = await segments.current_segments(conn, live)
            together: dict[str, list[Step | SessionEvent]] = {}
            for session_id in live:
                events = sessions[session_id]
                if stitched_together(events, where.get(session_id, (0, False))[1]):
                    together[session_id] = events
                elif await self._stitch_locked(conn, session_id, events):
                    closed.add(session_id)
            if together:
                closed |= await self._stitch_together(conn, together, where)
        return closed

    async def _stitch_together(
        self,
        conn: AsyncConnection,
        sessions: dict[str, list[Step | SessionEvent]],
        where: dict[str, tuple[int, bool]],
    ) -> set[str]:
        """`_stitch_locked` for sessions whose records leave their open segment the one open
        (`stitched_together`), every statement made once for all of them; the sessions whose
        segment closed. Each session's events go to its open segment and its steps are placed
        in it, then it advances once, as `_stitch_locked` does after its last step or end."""
        await archive.archive_events(
            conn,
            [
                (e, where.get(session_id, (0, False))[0], False)
                for session_id, events in sessions.items()
                for e in events
                if isinstance(e, SessionEvent)
            ],
        )
        steps = [e for events in sessions.values() for e in events if isinstance(e, Step)]
        await archive.archive_steps(conn, steps, self.io.steps)
        placed = await segments.placed_steps(conn, [s.step_id for s in steps])
        moving = [
            session_id
            for session_id, events in sessions.items()
            if any(isinstance(e, Step) or e.kind in ("ended", "refreshed") for e in events)
        ]
        # archiving made the row of each: a step's upsert or an end's
        views = await segments.session_views(conn, moving, self.io.steps)
        opened: list[Pair] = []
        placements: list[segments.Placement] = []
        writes = segments.StitchWrites()
        closed: set[str] = set()
        for session_id in moving:
            view = views[session_id]
            for step in sessions[session_id]:
                if not isinstance(step, Step) or step.step_id in placed:
                    continue  # an event, or a step placed before (a redelivery)
                placed.add(step.step_id)
                if view.n_steps == 0:
                    opened.append((session_id, view.segment))
                placements.append(self._placement(step, view.segment, view))
            if self._stitch(session_id, view, writes) is not None:
                closed.add(session_id)
        await segments.open_segments(conn, opened)
        await segments.record_placements(conn, placements)
        await self._write_stitched(conn, writes)
        return closed

    async def _place(
        self,
        conn: AsyncConnection,
        step: Step,
        placed: tuple[int, bool],
        view: segments.StitchView,
    ) -> None:
        """Classify a new step against the open segment's main line, record where it went and
        add it to `view`."""
        segment, opened = placed
        if opened:
            self.io.metrics.segments.inc()
        await segments.record_placement(conn, *self._placement(step, segment, view))

    def _placement(self, step: Step, segment: int, view: segments.StitchView) -> segments.Placement:
        """Classify a new step against the open segment's main line and add it to `view`."""
        turn_type, why = classify(step, main_line(view.steps))
        self.io.metrics.steps.labels(turn_type, why).inc()
        view.steps.append(step.model_copy(update={"turn_type": turn_type}))
        view.segments[step.step_id] = segment
        view.arrived_at[step.step_id] = datetime.now(UTC)
        view.n_steps += 1
        return step, segment, turn_type, why

    async def advance(self, session_id: str) -> None:
        """Emit the session's new turns; close it when it ended (or idled) completely."""
        async with self.io.db.begin() as conn:
            await segments.lock_session(conn, session_id)
            closed = await self._advance(conn, session_id)
        if closed is not None:
            self.io.ready.add(session_id)

    async def _advance(
        self, conn: AsyncConnection, session_id: str, view: segments.StitchView | None = None
    ) -> CloseReason | None:
        """`advance` inside a transaction that holds the session's lock; the close reason when
        the open segment closed (the caller assembles it once the transaction committed).

        With per_turn release an idle close keeps the segment's last main step open (its
        `tail`): when the conversation resumes, the user's next message is its next state, so
        the turn before a pause is judged like any other."""
        view = view or await segments.session_view(conn, session_id, self.io.steps)
        if view is None:
            return None
        writes = segments.StitchWrites()
        closed = self._stitch(session_id, view, writes)
        await self._write_stitched(conn, writes)
        return closed

    def _stitch(
        self, session_id: str, view: segments.StitchView, writes: segments.StitchWrites
    ) -> CloseReason | None:
        """What `_advance` writes for the session, added to `writes`; the close reason when its
        open segment closes."""
        if view.closed_at is not None:
            return None
        now = datetime.now(UTC)
        closed = close_decision(view, now, self.io.config)
        turns = stitch_session(
            view.steps,
            closed=closed,
            now=now,
            reorder_grace_s=self.io.config.reorder_grace_s,
            arrived_at=view.arrived_at,
            settled_through=view.settled_through,
            segment=view.segment,
            segments=view.segments,
        )
        tail: uuid.UUID | None = None
        hold = closed == "idle_timeout" and self.io.config.release_mode == "per_turn"
        if hold and turns and turns[-1].is_last:
            tail = turns.pop().step.step_id
        # a step's drift is found while its predecessor is in view, kept for its turn, which
        # may come in a later view (after an idle close its step is the next segment's tail)
        found = drifts_of(main_line(view.steps), view.emitted)
        writes.drifts.update(found)
        drifts = {**view.drifts, **found}
        new = [
            t.model_copy(update={"token_drift": drifts[t.step.step_id]})
            if t.step.step_id in drifts
            else t
            for t in turns
            if t.turn_id not in view.emitted
        ]
        for turn in new:
            self.io.metrics.turns.labels(turn.closed_reason).inc()
        writes.turns += new
        off = [(t, judgement_id_of(t.turn_id)) for t in new if not t.step.train]
        writes.skipped += off
        self.io.metrics.untrained.labels("step").inc(len(off))
        kept = [t for t in new if held_out(t, self.io.holdout_share)]
        writes.held_out += [(t, judgement_id_of(t.turn_id)) for t in kept]
        self.io.metrics.untrained.labels("held_out").inc(len(kept))
        if view.tail_segment is not None and any(t.step.step_id == view.tail for t in new):
            writes.tails_cleared.append((session_id, view.tail_segment))
        if closed is not None:
            # an earlier segment's tail that is still the last main step stays that segment's
            own_tail = tail if tail != view.tail else None
            writes.closes.append((session_id, view.segment, closed, own_tail))
        return closed

    async def _write_stitched(self, conn: AsyncConnection, writes: segments.StitchWrites) -> None:
        """Publish the new turns to judge, then write what says they were."""
        out = {t.turn_id for t, _ in writes.held_out}
        trained = [(t.session_id, t) for t in writes.turns if t.step.train and t.turn_id not in out]
        await self.io.emit_all(self.io.topics.turns, trained)
        await segments.write_stitched(conn, writes)

    async def close_tail(self, session_id: str) -> None:
        """A tail that waited `tail_timeout_s` for the conversation to resume: its turn is
        judged without a next state, so its segment can be assembled."""
        async with self.io.db.begin() as conn:
            await segments.lock_session(conn, session_id)
            await self._emit_tails(conn, session_id, self.io.config.tail_timeout_s, "idle_timeout")
        self.io.ready.add(session_id)

    async def _emit_tails(
        self, conn: AsyncConnection, session_id: str, waited_s: float, reason: CloseReason
    ) -> bool:
        """The session's held tails (that waited `waited_s`) as turns without a next state."""
        tails = await outbox.due_tails(conn, session_id, waited_s)
        for segment, step in tails:
            (turn,) = stitch_session([step], closed=reason, segment=segment)
            await self.io.emit(self.io.topics.turns, session_id, turn)
            self.io.metrics.turns.labels(turn.closed_reason).inc()
            await archive.record_turns(conn, [turn])
            await segments.clear_tail(conn, session_id, segment)
        return bool(tails)

    async def _ended(self, conn: AsyncConnection, event: SessionEvent) -> CloseReason | None:
        """An end or refresh: closes the open segment; one that comes after the worker closed
        it by idle (the gateway ends a session after its own, longer idle timeout, and a key
        then moves to a new session) ends the wait of the held tail: no resume will come."""
        closed = await self._advance(conn, event.session_id)
        if closed is None:
            _, already = await segments.current_segment(conn, event.session_id)
            reason = close_reason(event.kind, event.reason)
            if already and await self._emit_tails(conn, event.session_id, 0.0, reason):
                self.io.ready.add(event.session_id)
        return closed
