"""Reading what services wrote to a topic, from where the last read of it ended.

Tests wait for events by reading topics again and again, and a session's shared topics only
grow: reading each from offset 0 with a consumer that joined a group of its own cost ~3 s to
join and 2 s of an empty poll to end, a wait cost more the more the topic held, and every
record was decoded again at each look. Here each (broker, topic) keeps the records read so
far, per partition, and the next read starts where the last one ended, with a consumer that
joins no group: it ends once it has reached the partitions' ends and a poll came back empty.

A broker restarted empty on the same address starts its logs again at 0: whoever restarts one
calls `forget` (tests/fixtures/broker.py's `Broker.start` does)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import ConsumerRecord, TopicPartition

from claw_stream.bus.kafka import make_consumer, partitions_of, read_to_end
from claw_stream.events import Event, decode_event

E = TypeVar("E", bound=Event)


@dataclass
class _Partition:
    next_offset: int = 0
    records: list[ConsumerRecord] = field(default_factory=list)
    decoded: dict[tuple[type, int], Any] = field(default_factory=dict)


_READ: dict[tuple[str, str], dict[int, _Partition]] = {}


async def records(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    """Every record now on `topic`, in partition then offset order."""
    parts = _READ.setdefault((bootstrap, topic), {})
    consumer = make_consumer(bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await partitions_of(consumer, topic)
        firsts = await consumer.beginning_offsets(tps)
        starts: dict[TopicPartition, int] = {}
        for tp in tps:
            part = parts.setdefault(tp.partition, _Partition())
            starts[tp] = max(part.next_offset, firsts[tp])
        async for record in read_to_end(consumer, starts):
            part = parts[record.partition]
            if record.offset >= part.next_offset:
                part.records.append(record)
                part.next_offset = record.offset + 1
    finally:
        await consumer.stop()
    return [r for p in sorted(parts) for r in parts[p].records]


async def events(bootstrap: str, topic: str, model: type[E]) -> list[E]:
    """The records of `topic` decoded as `model` (each decoded once)."""
    out = []
    read = await records(bootstrap, topic)
    parts = _READ[(bootstrap, topic)]
    for record in read:
        cache = parts[record.partition].decoded
        key = (model, record.offset)
        if key not in cache:
            cache[key] = decode_event(model, record.value)
        out.append(cache[key])
    return out


def forget(bootstrap: str) -> None:
    """Drop what was read from a broker (one that a test restarts empty)."""
    for key in [k for k in _READ if k[0] == bootstrap]:
        del _READ[key]
