"""Every event kind travels through the real broker on its own topic and validates on arrival."""

from __future__ import annotations

import json
import uuid

import pytest

from claw_stream.bus.kafka import make_producer, publish
from claw_stream.bus.topics import apply_topics, load_specs
from claw_stream.events import EVENT_TYPES, DeadLetter, EventError, decode_event

from ..support import topic_reads
from ..support.factories import one_of_each


async def _consume(broker: str, topics: list[str]) -> list:
    """Every record on `topics` (each was acknowledged before: read to their ends)."""
    return [r for topic in topics for r in await topic_reads.records(broker, topic)]


def _key(event) -> str:
    if isinstance(event, DeadLetter):
        return event.key
    return getattr(event, "session_id", None) or event.policy


async def test_each_event_kind_round_trips_and_validates(broker: str) -> None:
    await apply_topics(broker)
    specs = {s.name: s for s in load_specs()}
    events = one_of_each()
    producer = make_producer(broker)
    await producer.start()
    try:
        for topic, event in events.items():
            await publish(producer, topic, _key(event), event)
    finally:
        await producer.stop()
    records = await _consume(broker, list(events))
    for topic, event in events.items():
        model = EVENT_TYPES[specs[topic].value]
        arrived = [(decode_event(model, r.value), r.key) for r in records if r.topic == topic]
        assert (event, _key(event).encode()) in arrived, topic


async def test_malformed_event_from_the_broker_is_rejected_naming_the_field(broker: str) -> None:
    specs = {s.name: s for s in load_specs()}
    good = json.loads(one_of_each()["claw.steps"].model_dump_json())
    good["response_token_ids"] = [10, 11]  # three logprobs for two tokens
    good["weight_version"] = "v3"
    topic = f"claw.test-malformed-{uuid.uuid4().hex[:8]}"  # not the shared claw.steps
    await apply_topics(broker, [specs["claw.steps"].model_copy(update={"name": topic})])
    producer = make_producer(broker)
    await producer.start()
    try:
        await producer.send_and_wait(topic, json.dumps(good).encode(), key=b"bad-session")
    finally:
        await producer.stop()
    records = [r for r in await _consume(broker, [topic]) if r.key == b"bad-session"]
    assert records
    with pytest.raises(EventError) as info:
        decode_event(EVENT_TYPES["Step"], records[0].value)
    assert "weight_version" in info.value.fields
