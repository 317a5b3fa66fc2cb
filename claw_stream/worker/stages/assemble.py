"""The assemble stage: judgements archived, samples made from what is final (per turn, or per
closed segment), written to the outbox with their release status and published; held samples
released when an update ends; samples a dead worker or a restarted broker lost sent again."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

from claw_stream.bus.kafka import (
    make_consumer,
    partitions_of,
    read_to_end,
)
from claw_stream.events import (
    Judgement,
    Sample,
    WeightEvent,
)
from claw_stream.store import consent
from claw_stream.versions.records import record as record_version
from claw_stream.worker.logic import release
from claw_stream.worker.logic.samples import (
    assemble_session,
    episode_drafts,
    needs_judgements,
    turn_drafts,
)
from claw_stream.worker.stages.io import Record, WorkerIO, infra_retries
from claw_stream.worker.state import archive, outbox
from claw_stream.worker.state.rows import Known, Pair

log = logging.getLogger(__name__)


class Assembler:
    name = "assemble"

    def __init__(
        self,
        io: WorkerIO,
        learn: Callable[[Sequence[Judgement]], Awaitable[None]] | None = None,
    ):
        self.io = io
        self.learn = learn  # what the archived judgements teach (stages/skills.py)

    async def archive_judgements(self, records: list[Record]) -> Known | None:
        """A batch of judgements archived in one statement (one transaction per judgement cost
        more than the insert): those it stored. None when one does not decode: then each goes
        its own way."""
        texts: dict[uuid.UUID, str] = {}
        judgements = self.io.decode_all(records, texts)
        if judgements is None:
            return None
        self.io.metrics.records.labels("assemble").inc(len(judgements))
        try:
            async for attempt in infra_retries():
                with attempt:
                    async with self.io.db.begin() as conn:
                        known = await archive.archive_judgements(conn, judgements, texts)
        except Exception:
            log.exception("archiving %d judgements at once failed", len(judgements))
            return None
        self.io.ready.update(j.session_id for j in judgements)
        if self.learn is not None:
            await self.learn(judgements)
        return known

    async def flush_releases(self, known: Known | None = None) -> None:
        """One release pass for every session a handled batch made ready (see `release_pass`);
        what a crash here leaves behind, the sweeper's pass takes."""
        if not self.io.ready and not self.io.late:
            return
        # a late episode reward's segment is released with the sessions made ready
        sessions = sorted(self.io.ready | {session for session, _ in self.io.late})
        late, self.io.ready, self.io.late = list(self.io.late), set(), set()
        async for attempt in infra_retries():
            with attempt:
                await self.release_pass(sessions, late, known)

    async def on_judgement(self, judgement: Judgement) -> None:
        async with self.io.db.begin() as conn:
            await archive.archive_judgement(conn, judgement)
        self.io.ready.add(judgement.session_id)
        if self.learn is not None:
            await self.learn([judgement])

    async def release_pass(
        self,
        sessions: list[str] | None,
        late: list[Pair] | None = None,
        known: Known | None = None,
    ) -> None:
        """Assemble what is ready, for these sessions (None: any), in one transaction whatever
        their number: per_turn, each judged turn whose signals are final becomes its sample;
        each closed segment with every turn judged is assembled (per_episode: all its samples;
        per_turn: its episode-reward samples and the at-least-one rule).

        Batched across sessions: a pass costs about ten statements however many turns it
        releases, where one session at a time cost about as many per session (the worker
        then ran at ~52 steps/s in bench/pipeline_bench.py). Sample ids are derived and the
        insert returns only new rows, so concurrent passes (every worker's sweeper) never
        publish a sample twice; judgements are taken FOR UPDATE SKIP LOCKED."""
        c = self.io.config
        per_turn = c.release_mode == "per_turn"
        to_publish: list[Sample] = []
        counts: dict[str, int] = {}

        def count(more: dict[str, int]) -> None:
            for k, v in more.items():
                counts[k] = counts.get(k, 0) + v

        topic = self.io.topics.samples
        async with self.io.db.begin() as conn:
            due = (
                await outbox.due_judgements(conn, sessions, c.signal_grace_s, known=known)
                if per_turn
                else []
            )
            if due:
                await outbox.mark_sampled(conn, [j.judgement_id for j in due])
            segments = await outbox.segments_to_assemble(conn, sessions, late, per_turn)
            if not due and not segments:
                return
            pairs = {(j.session_id, j.turn.segment or 0) for j in due} | set(segments)
            events, steps = await outbox.segment_signals(conn, pairs)
            by_pair: dict[Pair, list[Judgement]] = {}
            for j in due:
                by_pair.setdefault((j.session_id, j.turn.segment or 0), []).append(j)
            drafts = [
                d
                for pair, js in by_pair.items()
                for d in turn_drafts(js, steps[pair], events[pair], c, topic)
            ]
            # per_turn: only an episode reward needs the judgements again (reading and decoding
            # every closed segment's was ~5% of the worker's CPU in bench/pipeline_bench.py)
            needed = [p for p in segments if not per_turn or needs_judgements(events[p], c)]
            of_segment = await outbox.segment_judgements(conn, needed, known)
            for pair in segments:
                judgements = of_segment.get(pair, [])
                if per_turn:
                    drafts += episode_drafts(judgements, events[pair], c, topic)
                else:
                    drafts += assemble_session(judgements, events[pair], c, topic)
            off = await consent.untrainable(
                conn, {d.sample.session_id for d in drafts} | {s for s, _ in segments}
            )
            if off:  # switched off while judged: their samples are never made
                drafts = [d for d in drafts if d.sample.session_id not in off]
            shared = self.io.policy
            gate = await outbox.gates(
                conn,
                release.policies_of([d.sample for d in drafts], shared),
                shared,
                c.update_timeout_s,
            )
            out, n = await outbox.store_samples(
                conn, release.decide(drafts, gate, c.max_staleness), topic
            )
            to_publish += out
            count(n)
            if segments:
                if not per_turn:
                    await outbox.mark_sampled(
                        conn, [j.judgement_id for js in of_segment.values() for j in js]
                    )
                signal = await outbox.signal_counts(conn, segments)
                if per_turn and c.at_least_one_per_session:
                    for pair in [p for p in segments if not signal[p] and p[0] not in off]:
                        last = await outbox.last_without_signal(conn, pair)
                        if last is None:
                            continue
                        if (policy := last.policy or shared) not in gate.by_policy:
                            gate.by_policy[policy] = await outbox.gate(
                                conn, policy, c.update_timeout_s
                            )
                        decided = release.decide_held([last], gate, c.max_staleness)
                        await outbox.set_released(conn, decided)
                        status, sample = decided[0]
                        if status == "pending":
                            to_publish.append(sample)
                        count({status: 1, "no_signal": -1})
                        signal[pair] = int(status != "dropped")
                await outbox.mark_assembled(conn, signal)
        for status, k in counts.items():
            if k > 0:
                self.io.metrics.samples.labels(status).inc(k)
        await self.publish_samples(to_publish)

    async def publish_samples(self, samples: list[Sample]) -> None:
        """Send all, then wait for every ack at once (acks=all each), then mark them."""
        if not samples:
            return
        await self.io.emit_all(self.io.topics.samples, [(s.session_id, s) for s in samples])
        await outbox.mark_published(self.io.db, [s.sample_id for s in samples])

    async def on_weight(self, event: WeightEvent) -> None:
        async with self.io.db.begin() as conn:
            await record_version(conn, event)
        if event.status != "updating":
            await self.release()

    async def release(self) -> None:
        c = self.io.config
        async with self.io.db.begin() as conn:
            held = await outbox.held_samples(conn)
            if not held:
                return
            shared = self.io.policy
            gates = await outbox.gates(
                conn, release.policies_of(held, shared), shared, c.update_timeout_s
            )
            decided = [
                d for d in release.decide_held(held, gates, c.max_staleness) if d[0] != "held"
            ]
            await outbox.set_released(conn, decided)
        samples = [sample for status, sample in decided if status == "pending"]
        dropped = len(decided) - len(samples)
        if dropped:
            self.io.metrics.samples.labels("dropped").inc(dropped)
        if samples:
            self.io.metrics.samples.labels("pending").inc(len(samples))
        await self.publish_samples(samples)

    async def resend_lost(self) -> None:
        """Published samples the trainer has not trained and the samples topic no longer
        holds (the broker restarted without them) are published again; the trainer dedupes
        by sample id what it did train."""
        async with self.io.db.begin() as conn:
            waiting = await outbox.untrained(conn, self.io.config.retrain_after_s)
        if not waiting:
            return
        there = await self.on_topic({s.sample_id for s in waiting})
        lost = [s for s in waiting if s.sample_id not in there]
        if lost:
            log.warning(
                "%d published samples are not on %s any more and were never trained: resent",
                len(lost),
                self.io.topics.samples,
            )
            self.io.metrics.samples.labels("resent").inc(len(lost))
            for sample in lost:
                await self.io.emit(self.io.topics.samples, sample.session_id, sample)

    async def on_topic(self, sample_ids: set[uuid.UUID], window: int = 20_000) -> set[uuid.UUID]:
        """Which of these samples are among the newest `window` records of each partition."""
        consumer = make_consumer(self.io.bootstrap)
        await consumer.start()
        found: set[uuid.UUID] = set()
        try:
            parts = await partitions_of(consumer, self.io.topics.samples)
            ends = await consumer.end_offsets(parts)
            firsts = await consumer.beginning_offsets(parts)
            starts = {tp: max(firsts[tp], ends[tp] - window) for tp in parts}
            async for record in read_to_end(consumer, starts):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    found.add(uuid.UUID(json.loads(record.value)["sample_id"]))
        finally:
            await consumer.stop()
        return found & sample_ids
