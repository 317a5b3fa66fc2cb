"""Consumer lag per pipeline stage, read from the broker: for each partition of a stage's
topics, the end offset less the offset its consumer group committed (the whole partition, from
its first offset, when the group committed nothing there yet).

Stages: `worker` (gateway → worker: steps and session events not yet consumed by the worker's
group), `judge` (turns awaiting judgement by the worker's group), `trainer` (worker → trainer:
samples not yet consumed by the trainer's group)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

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
    """An admin client and a metadata consumer kept open between reads."""

    def __init__(self, bootstrap: str, stages: list[Stage], timeout_ms: int = 5_000):
        self.bootstrap = bootstrap
        self.stages = stages
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
        self.consumer: AIOKafkaConsumer = make_consumer(bootstrap, request_timeout_ms=timeout_ms)

    async def start(self) -> None:
        await self.admin.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def __aenter__(self) -> LagReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def read(self) -> list[TopicLag]:
        names = sorted({t for s in self.stages for t in s.topics})
        parts = await partitions_of(self.consumer, *names)
        ends = await self.consumer.end_offsets(parts)
        firsts = await self.consumer.beginning_offsets(parts)
        committed: dict[str, dict[TopicPartition, int]] = {}
        for group in {s.group for s in self.stages}:
            try:
                offsets = await self.admin.list_consumer_group_offsets(group)
            except Exception:  # no such group yet: it consumed nothing
                offsets = {}
            committed[group] = {tp: meta.offset for tp, meta in offsets.items()}
        out = []
        for stage in self.stages:
            for topic in stage.topics:
                tps = [tp for tp in parts if tp.topic == topic]
                if not tps:  # topic missing: nothing to report
                    continue
                out.append(
                    TopicLag(
                        stage=stage.name,
                        group=stage.group,
                        topic=topic,
                        lag=sum(
                            partition_lag(ends[tp], committed[stage.group].get(tp), firsts[tp])
                            for tp in tps
                        ),
                        end=sum(ends[tp] for tp in tps),
                    )
                )
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
