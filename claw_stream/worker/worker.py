"""The worker, independent of Faust: one table of what each topic carries and which stage
handles it, and the batch each Faust agent (`app.py`) hands to its own stage.

Stages (`stages/`): `stitch.py` (steps and session events → turns), `judge.py` (turns →
judgements), `assemble.py` (judgements and weight events → samples; `skills.py` learns from the
judgements it archives), `sweep.py` (what time decides), over the I/O they share (`io.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from claw_stream.events import (
    Event,
    EventError,
    Judgement,
    SessionEvent,
    Step,
    Turn,
    WeightEvent,
)
from claw_stream.names import Topics
from claw_stream.skills.config import SkillsSettings
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.stages.assemble import Assembler
from claw_stream.worker.stages.io import Record, WorkerIO, infra_retries
from claw_stream.worker.stages.judge import Judger
from claw_stream.worker.stages.skills import SkillLearner
from claw_stream.worker.stages.stitch import Stitcher
from claw_stream.worker.stages.sweep import Sweeper

log = logging.getLogger(__name__)
SWEEP_STOP_WAIT_S = 10.0  # a stop waits this long for a sweep under way


@dataclass(frozen=True)
class TopicRoute:
    """What a topic carries, the agent that reads it (metrics, dead letters) and its handler."""

    model: type[Event]
    agent: str
    handler: Callable[[Any], Awaitable[Any]]


class Worker:
    """One worker process: its stages and the routes between them."""

    def __init__(
        self,
        config: WorkerSettings,
        kafka_bootstrap: str,
        database_url: str,
        policy: str = "policy",
        topics: Topics | None = None,
        holdout_share: float = 0.0,
        skills: SkillsSettings | None = None,
    ):
        self.io = io = WorkerIO(
            config, kafka_bootstrap, database_url, policy, topics, holdout_share
        )
        self.stitcher = Stitcher(io)
        self.judger = Judger(io)
        self.learner = SkillLearner(io, skills) if skills is not None else None
        self.assembler = Assembler(io, self.learner.on_judgements if self.learner else None)
        self.sweeper = Sweeper(io, self.stitcher, self.judger, self.assembler)
        t = io.topics
        self.routes: dict[str, TopicRoute] = {
            t.steps: TopicRoute(Step, "stitch", self.stitcher.stitch_one),
            t.session_events: TopicRoute(SessionEvent, "stitch", self.stitcher.stitch_one),
            t.turns: TopicRoute(Turn, "judge", self.judger.on_turn),
            t.judgements: TopicRoute(Judgement, "assemble", self.assembler.on_judgement),
            t.weights: TopicRoute(WeightEvent, "weights", self.assembler.on_weight),
        }
        io.models = {topic: route.model for topic, route in self.routes.items()}
        self.held: set[Any] = set()  # the topic-partitions the group assigned this worker
        self.assigned(set())
        self._starting: asyncio.Lock | None = None
        self._sweeping = asyncio.Lock()
        self.stopping = False

    async def start(self) -> None:
        """Connect once, in the running loop (Faust's agents and timer each call it)."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if not self.io.started:
                await self.io.connect()
                await self.judger.start()

    async def stop(self) -> None:
        """A sweep under way ends before the clients close (given SWEEP_STOP_WAIT_S): the
        sweeper's timer still fires while Faust shuts down, and a sweep that found the producer
        closed under it logged a traceback at every stop."""
        self.stopping = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SWEEP_STOP_WAIT_S):
                await self._sweeping.acquire()
                self._sweeping.release()
        if self.io.started:
            await self.judger.stop()
            await self.io.stop()

    def assigned(self, partitions: set[Any]) -> None:
        """The group's whole assignment to this worker (topic-partitions) after a rebalance,
        on `claw_worker_partitions{topic}`: how the workers share the partitions, which sit
        idle."""
        self.held = set(partitions)
        self._count_held()

    def revoked(self, partitions: set[Any]) -> None:
        """Partitions taken from this worker as a rebalance starts (under the eager protocol
        all of them: until the new assignment it holds none)."""
        self.held -= partitions
        self._count_held()

    def _count_held(self) -> None:
        held = Counter(tp.topic for tp in self.held)
        for topic in self.routes:
            self.io.metrics.partitions.labels(topic).set(held.get(topic, 0))

    # -- the agents' batches ----------------------------------------------------------------

    async def stitch(self, records: list[Record]) -> None:
        """A batch's sessions in one transaction (`Stitcher.stitch_batch`); what that leaves,
        record by record, each a batch of one (a bad record goes to the dead letters alone)."""
        rest = await self.stitcher.stitch_batch(list(_by_session(records).values()))
        await self._each(rest)
        await self.assembler.flush_releases()

    async def judge(self, records: list[Record]) -> None:
        """Turns are judged independently, up to `session_concurrency` at once."""
        decoded = await self.judger.prefetch_turns(records) if len(records) > 1 else {}
        await self._each([[r] for r in records], decoded)
        await self.assembler.flush_releases()

    async def assemble(self, records: list[Record]) -> None:
        known = await self.assembler.archive_judgements(records)
        if known is not None:
            await self.assembler.flush_releases(known)
            return
        await self._each(list(_by_session(records).values()))
        await self.assembler.flush_releases()

    async def weights(self, records: list[Record]) -> None:
        await self._each(list(_by_session(records).values()))
        await self.assembler.flush_releases()

    async def sweep(self) -> None:
        async with self._sweeping:
            if not self.stopping:
                await self.sweeper.sweep()

    async def _each(
        self,
        groups: Sequence[list[Record]],
        decoded: dict[int, Event] | None = None,
    ) -> None:
        """Records of one group one after the other, groups concurrently up to
        `session_concurrency`."""
        slots = asyncio.Semaphore(self.io.config.session_concurrency)
        decoded = decoded or {}

        async def run(group: list[Record]) -> None:
            async with slots:
                for r in group:
                    await self.handle(r, decoded.get(id(r)))

        await asyncio.gather(*(run(g) for g in groups))

    async def handle(self, record: Record, event: Event | None = None) -> None:
        """Decode one record (unless `event` is the record decoded already) and run its
        handler; bad input and failures go to the DLQ, infrastructure errors are retried (the
        record is not acknowledged meanwhile)."""
        route = self.routes[record.topic]
        self.io.metrics.records.labels(route.agent).inc()
        try:
            event = event or self.io.decode(route.model, record.value or b"")
        except EventError as exc:
            await self._dead_letter(route, record, exc)
            return
        try:
            async for attempt in infra_retries():
                with attempt:
                    await route.handler(event)
        except Exception as exc:
            log.exception("%s failed on %s", route.agent, record.topic)
            await self._dead_letter(route, record, exc)

    async def _dead_letter(self, route: TopicRoute, record: Record, error: BaseException) -> None:
        await self.io.dead_letter(
            route.agent,
            record.topic,
            record.value,
            error,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
        )


def _by_session(records: list[Record]) -> dict[Any, list[Record]]:
    groups: dict[Any, list[Record]] = {}
    for record in records:
        groups.setdefault(record.key, []).append(record)
    return groups
