"""The event contract: valid events round-trip; malformed ones fail naming the bad field."""

from __future__ import annotations

import json
import uuid

import pytest

from claw_stream.events import (
    EVENT_TYPES,
    EventError,
    SessionEvent,
    Step,
    WeightEvent,
    decode_event,
    encode_event,
)
from claw_stream.ids import derive_uuid7, uuid7, uuid7_time_ms

from ..support.factories import make_step, one_of_each


@pytest.mark.parametrize("topic", sorted(one_of_each()))
def test_every_event_round_trips_through_json(topic: str) -> None:
    event = one_of_each()[topic]
    decoded = decode_event(type(event), encode_event(event))
    assert decoded == event
    assert decoded.schema_version == 1
    assert decoded.id.version == 7
    assert decoded.created_at.tzinfo is not None


def test_every_topic_payload_of_the_architecture_is_modelled() -> None:
    assert set(EVENT_TYPES) == {
        "Step",
        "SessionEvent",
        "Turn",
        "Judgement",
        "Sample",
        "WeightEvent",
        "DeadLetter",
    }


def _step_json(**changes: object) -> dict:
    data = json.loads(encode_event(make_step()))
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is ...:
            del node[leaf]
        else:
            node[leaf] = value
    return data


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"turn_index": "3"}, "turn_index", "valid integer"),
        ({"turn_index": -1}, "turn_index", "greater than or equal"),
        ({"session_id": ...}, "session_id", "Field required"),
        ({"session_id": ""}, "session_id", "at least 1"),
        ({"turn_type": "aside"}, "turn_type", "'main' or 'side'"),
        ({"response_logprobs": [-0.1, -0.2]}, "<root>", "2 entries for 3 response_token_ids"),
        ({"response_logprobs": [-0.1, "x", -0.3]}, "response_logprobs[1]", "valid number"),
        ({"response_logprobs": [-0.1, 0.5, -0.3]}, "response_logprobs[1]", "less than or equal"),
        ({"prompt_token_ids": [1, -5]}, "prompt_token_ids[1]", "greater than or equal"),
        ({"step_id": str(uuid.uuid4())}, "step_id", "UUIDv7"),
        ({"created_at": "2026-11-22T10:00:00"}, "created_at", "timezone"),
        ({"schema_version": 2}, "schema_version", "1"),
        ({"surprise": 1}, "surprise", "Extra inputs"),
        ({"request__messages__0__role": "robot"}, "request.messages[0].role", "'system'"),
        ({"response__message__role": "user"}, "response", "assistant"),
        ({"usage__prompt_tokens": 1.5}, "usage.prompt_tokens", "valid integer"),
    ],
)
def test_malformed_step_is_rejected_naming_the_field(changes: dict, field: str, words: str) -> None:
    raw = json.dumps(_step_json(**changes))
    with pytest.raises(EventError) as info:
        decode_event(Step, raw)
    assert field in info.value.fields
    assert words in str(info.value)
    assert str(info.value).startswith("invalid Step:")


def test_non_json_payload_is_rejected_clearly() -> None:
    with pytest.raises(EventError, match="invalid Step: <root>: Invalid JSON"):
        decode_event(Step, b"{not json")


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
def test_reward_must_be_finite(bad: str) -> None:
    raw = json.dumps({"session_id": "s", "kind": "reward"})[:-1] + f', "reward": {bad}}}'
    with pytest.raises(EventError) as info:
        decode_event(SessionEvent, raw)
    assert "reward" in info.value.fields


def test_kind_specific_fields_are_required() -> None:
    with pytest.raises(EventError, match="'reward' event needs reward"):
        decode_event(SessionEvent, json.dumps({"session_id": "s", "kind": "reward"}))
    with pytest.raises(EventError, match="needs score or text"):
        decode_event(SessionEvent, json.dumps({"session_id": "s", "kind": "feedback"}))
    with pytest.raises(EventError, match="'failed' weight event needs error"):
        decode_event(WeightEvent, json.dumps({"policy": "p", "version": 1, "status": "failed"}))


def test_opd_sample_needs_teacher_logprobs() -> None:
    data = json.loads(encode_event(one_of_each()["claw.samples"]))
    data["teacher_logprobs"] = None
    with pytest.raises(EventError, match="method 'combine' needs teacher_logprobs"):
        decode_event(EVENT_TYPES["Sample"], json.dumps(data))


def test_uuid7_is_versioned_and_strictly_increasing() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_derived_ids_are_deterministic_valid_and_keep_the_parent_time() -> None:
    parent = uuid7()
    a, b = derive_uuid7(parent, "turn"), derive_uuid7(parent, "turn")
    assert a == b and a.version == 7 and a.variant == uuid.RFC_4122
    assert derive_uuid7(parent, "judgement") != a
    assert uuid7_time_ms(a) == uuid7_time_ms(parent)
