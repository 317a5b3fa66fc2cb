"""Consumer lag per pipeline stage, read from the broker: for each partition of a stage's
topics, the end offset less the offset its consumer group committed (the whole partition, from
its first offset, when the group committed nothing there yet).

Stages: `worker` (gateway → worker: steps and session events not yet consumed by the worker's
group), `judge` (turns awaiting judgement by the worker's group), `trainer` (worker → trainer:
samples not yet consumed by the trainer's group).

Committed offsets are read by a consumer of each group that never subscribes (so it never
joins the group), for the partitions it names: asked for all of a group's partitions (the admin
client's OffsetFetch without partitions), Tansu answers a body aiokafka cannot decode and the
connection closes; named partitions work on Tansu and Kafka alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer

from claw_stream.bus.kafka import make_consumer, partitions_of
from claw_stream.names import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    group: str
    topics: tuple[str, ...]


@dataclass(frozen=True)
class TopicLag:
    stage: str
    group: str
    topic: str
    lag: int  # records not yet consumed by the group, summed over the topic's partitions
    end: int  # records written (end offsets summed)


def pipeline_stages(
    topics: Topics, worker_group: str, trainer_group: str, samples_topic: str | None = None
) -> list[Stage]:
    return [
        Stage("worker", worker_group, (topics.steps, topics.session_events)),
        Stage("judge", worker_group, (topics.turns,)),
        Stage("trainer", trainer_group, (samples_topic or topics.samples,)),
    ]


def partition_lag(end: int, committed: int | None, first: int) -> int:
    """Tansu may answer an end offset short of the last batch's records: never below 0."""
    return max(0, end - (first if committed is None or committed < 0 else committed))


class LagReader:
    """A metadata consumer and one offset reader per consumer group, kept open between reads."""

    def __init__(self, bootstrap: str, stages: list[Stage], timeout_ms: int = 5_000):
        self.bootstrap = bootstrap
        self.stages = stages
        self.consumer: AIOKafkaConsumer = make_consumer(bootstrap, request_timeout_ms=timeout_ms)
        self.groups: dict[str, AIOKafkaConsumer] = {
            group: make_consumer(bootstrap, group_id=group, request_timeout_ms=timeout_ms)
            for group in sorted({s.group for s in stages})
        }

    async def start(self) -> None:
        try:
            for consumer in (self.consumer, *self.groups.values()):
                await consumer.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for consumer in (self.consumer, *self.groups.values()):
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def __aenter__(self) -> LagReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def read(self) -> list[TopicLag]:
        out = []
        for stage in self.stages:
            reader = self.groups[stage.group]
            for topic in stage.topics:
                tps = await partitions_of(self.consumer, topic)
                if not tps:  # topic missing: nothing to report
                    continue
                ends = await self.consumer.end_offsets(tps)
                firsts = await self.consumer.beginning_offsets(tps)
                lag = 0
                for tp in tps:
                    lag += partition_lag(ends[tp], await reader.committed(tp), firsts[tp])
                out.append(TopicLag(stage.name, stage.group, topic, lag, sum(ends.values())))
        return out


async def read_lag(bootstrap: str, stages: list[Stage]) -> list[TopicLag]:
    async with LagReader(bootstrap, stages) as reader:
        return await reader.read()


class LagMonitor:
    """The gateway's view of the lag, refreshed every `every_s` in the background so a scrape
    of /metrics never waits on the broker; `last` is empty while the broker cannot be read."""

    def __init__(self, bootstrap: str, stages: list[Stage], every_s: float = 5.0):
        self.bootstrap = bootstrap
        self.stages = stages
        self.every_s = every_s
        self.last: list[TopicLag] = []
        self.read_s = 0.0  # how long the last refresh took
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        reader: LagReader | None = None
        try:
            while True:
                try:
                    if reader is None:
                        reader = LagReader(self.bootstrap, self.stages)
                        await reader.start()
                    began = time.perf_counter()
                    self.last = await reader.read()
                    self.read_s = time.perf_counter() - began
                except Exception as exc:  # the broker is down or restarting: try again later
                    log.debug("consumer lag not read: %s", exc)
                    self.last = []
                    if reader is not None:
                        with contextlib.suppress(Exception):
                            await reader.stop()
                        reader = None
                await asyncio.sleep(self.every_s)
        finally:
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.stop()
