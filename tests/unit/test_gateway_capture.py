"""The gateway's capture logic without a server: answers parsed, Steps built and checked,
spool slots claimed. The end-to-end behaviour is in test_gateway*.py."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from claw_stream.events import Step
from claw_stream.gateway.capture import (
    ClientAsked,
    RawIds,
    StepContext,
    StreamCapture,
    build_step,
    encode_json,
    parse_answer,
)
from claw_stream.gateway.delivery.spool import Spool, SpooledRecord, SpoolSlot, release_lock
from claw_stream.ids import uuid7

BODY: dict[str, Any] = {
    "model": "policy",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": {"p": "."}}}],
        },
        {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
    ],
    "temperature": 1,
    "stop": "END",
    "user": "someone",
}
ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "model": "policy",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there"},
            "logprobs": {"content": [{"logprob": -0.5}, {"logprob": 0.0}]},
            "finish_reason": "stop",
            "token_ids": [11, 12],
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    "prompt_token_ids": [1, 2, 3, 4, 5],
}


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def step_of(answer: dict[str, Any], body: dict[str, Any] | None = None) -> Step:
    ctx = StepContext(uuid7(), "s-1", "g", "main", 3, copy.deepcopy(body or BODY))
    step_id, value = build_step(ctx, answer, 2, 12.5)
    step = Step.model_validate_json(value)  # the contract, strictly
    assert step.step_id == step_id
    return step


def test_compact_prompt_ids_stay_bytes_and_reach_the_step_exactly() -> None:
    answer = parse_answer(compact(ANSWER))
    assert isinstance(answer["prompt_token_ids"], RawIds)
    assert len(answer["prompt_token_ids"]) == 5 and answer["prompt_token_ids"].first() == 1
    step = step_of(answer)
    assert step.prompt_token_ids == [1, 2, 3, 4, 5]
    assert step.response_token_ids == [11, 12] and step.response_logprobs == [-0.5, 0.0]
    assert json.loads(encode_json(answer))["prompt_token_ids"] == [1, 2, 3, 4, 5]


def test_the_request_half_is_normalised_as_the_contract_says() -> None:
    step = step_of(parse_answer(compact(ANSWER)))
    messages = step.request.messages
    assert messages[1].content == "hi"  # text parts joined, other parts dropped
    assert messages[2].tool_calls[0].function.arguments == '{"p": "."}'
    assert step.request.sampling.stop == ["END"] and step.request.sampling.temperature == 1.0
    assert step.request.extra == {"user": "someone"}
    assert (step.session_id, step.group_id, step.turn_index, step.weight_version) == (
        "s-1",
        "g",
        3,
        2,
    )


@pytest.mark.parametrize(
    "content",
    [
        b'{"choices":[{"message":{"role":"assistant","content":"\\"prompt_token_ids\\":[9]"},'
        b'"token_ids":[1],"prompt_token_ids":[5,6]}]}',  # per choice; a lookalike in the text
        b'{"choices":[],"prompt_token_ids": [5, 6]}',  # spaces: parsed whole
        b'{"choices":[],"x":{"prompt_token_ids":[7]},"prompt_token_ids":[5,6]}',  # nested first
    ],
)
def test_prompt_ids_are_found_where_they_are_or_parsed_whole(content: bytes) -> None:
    answer = parse_answer(content)
    holder = answer if "prompt_token_ids" in answer else answer["choices"][0]
    assert json.loads(encode_json(holder["prompt_token_ids"])) == [5, 6]
    assert json.loads(encode_json(answer)) == json.loads(content)


@pytest.mark.parametrize(
    "content", [b'{"choices":[],"prompt_token_ids":[1,,2]}', b'{"prompt_token_ids":[1,2]']
)
def test_malformed_answers_are_rejected(content: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        parse_answer(content)


def broken(change) -> dict[str, Any]:
    answer = copy.deepcopy(ANSWER)
    change(answer, answer["choices"][0])
    return answer


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (broken(lambda a, c: c.update(token_ids=[1.5, 2])), "integers"),
        (broken(lambda a, c: c.update(token_ids=["1", "2"])), "integers"),
        (broken(lambda a, c: c.update(token_ids=[1])), "one per sampled token"),
        (broken(lambda a, c: a.update(prompt_token_ids=[])), "prompt_token_ids may be empty only"),
        (broken(lambda a, c: c["logprobs"]["content"][0].update(logprob=math.nan)), "finite"),
        (broken(lambda a, c: c.update(finish_reason="bored")), "finish_reason"),
        (broken(lambda a, c: c["message"].update(content=5)), "content"),
        (broken(lambda a, c: c.update(token_ids=[-1, 2])), "greater than or equal to 0"),
    ],
)
def test_a_broken_answer_builds_no_step(answer: dict[str, Any], words: str) -> None:
    ctx = StepContext(uuid7(), "s-1", None, "main", 0, copy.deepcopy(BODY))
    with pytest.raises(ValueError, match=words):
        build_step(ctx, answer, 0, 1.0)


def test_a_request_the_contract_refuses_builds_no_step() -> None:
    body = copy.deepcopy(BODY)
    body["messages"].append({"role": "function", "content": "legacy"})
    ctx = StepContext(uuid7(), "s-1", None, "main", 0, body)
    with pytest.raises(ValueError, match="role"):
        build_step(ctx, copy.deepcopy(ANSWER), 0, 1.0)


def record(n: int) -> SpooledRecord:
    return SpooledRecord("claw.steps", b"k", b"{}", "step_id", f"id-{n}")


def sse(*chunks: Any) -> bytes:
    return b"".join(b"data: " + compact(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def token_chunk(text: str, token_id: int, **extra: Any) -> dict[str, Any]:
    choice = {
        "index": 0,
        "delta": {"content": text},
        "logprobs": {"content": [{"token": text, "logprob": -0.5}]},
        "finish_reason": None,
        "token_ids": [token_id],
    }
    return {"id": "c", "model": "policy", "choices": [choice], **extra}


STREAM = sse(
    token_chunk("", 0, prompt_token_ids=[1, 2, 3]) | {"choices": []},
    token_chunk("Hel", 11),
    token_chunk('lo \u00e9"\\', 12),
    {"id": "c", "model": "policy", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "c", "model": "policy", "choices": [], "usage": {"prompt_tokens": 3}},
)


def relay(capture: StreamCapture, pieces: list[bytes]) -> tuple[list[dict[str, Any]], bytes]:
    """What the client gets now (parsed chunks) and what is held for after the Step."""
    now = b"".join(capture.feed(piece) for piece in pieces) + capture.close()
    events = [orjson.loads(e[6:]) for e in now.split(b"\n\n") if e]
    return events, b"".join(capture.held)


def test_a_stream_reaches_the_client_stripped_with_its_end_held_and_the_answer_whole() -> None:
    capture = StreamCapture(ClientAsked(token_ids=False, logprobs=False, usage=False))
    events, held = relay(capture, [STREAM])
    assert [e["choices"][0]["delta"]["content"] for e in events[1:]] == ["Hel", 'lo é"\\']
    for event in events:
        assert "prompt_token_ids" not in event
        for choice in event["choices"]:
            assert "token_ids" not in choice and choice["logprobs"] is None
    assert b'"finish_reason":"stop"' in held and b"usage" not in held  # usage was not asked
    assert capture.done and capture.broken is None
    answer = capture.as_response()
    choice = answer["choices"][0]
    assert choice["message"]["content"] == 'Hello é"\\' and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == [11, 12]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5, -0.5]
    assert encode_json(answer["prompt_token_ids"]) == b"[1,2,3]"
    assert answer["usage"] == {"prompt_tokens": 3}


def test_a_client_that_asked_for_tokens_logprobs_and_usage_gets_them() -> None:
    capture = StreamCapture(ClientAsked(token_ids=True, logprobs=True, usage=True))
    events, held = relay(capture, [STREAM])
    assert events[0]["prompt_token_ids"] == [1, 2, 3]
    assert [e["choices"][0]["token_ids"] for e in events[1:]] == [[11], [12]]
    assert events[1]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    assert b'"usage":{"prompt_tokens":3}' in held


@pytest.mark.parametrize("size", [1, 7, 64, 1000])
def test_a_stream_cut_into_any_blocks_relays_the_same(size: int) -> None:
    asked = ClientAsked(token_ids=False, logprobs=False, usage=True)
    whole = StreamCapture(asked)
    expected = relay(whole, [STREAM])
    cut = StreamCapture(asked)
    pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert relay(cut, pieces) == expected
    assert cut.as_response() | {"prompt_token_ids": None} == whole.as_response() | {
        "prompt_token_ids": None
    }


def test_errors_pass_at_once_noise_is_dropped_and_an_unreadable_chunk_marks_the_answer() -> None:
    capture = StreamCapture(ClientAsked(token_ids=False, logprobs=False, usage=False))
    error = {"error": {"message": "engine overloaded", "code": 503}}
    stream = (
        b": keep-alive\n\nevent: ping\ndata: not json\n\n"
        + b"data: "
        + compact(token_chunk("a", 5))
        + b"\n\n"
        + b"data: "
        + compact({"choices": [{"index": 0, "logprobs": {"content": [7]}}]})
        + b"\n\n"
        + b"data: "
        + compact(error)
        + b"\n\n"
    )
    events, held = relay(capture, [stream])
    assert events[0]["choices"][0]["delta"]["content"] == "a"
    assert events[-1] == error and held == b""
    assert capture.broken is not None and "unreadable stream chunk" in str(capture.broken)
    assert not capture.done  # no [DONE]: the answer is incomplete


def test_each_process_claims_its_own_slot_and_a_dead_ones_slot_is_handed_over(
    tmp_path: Path,
) -> None:
    first, second = SpoolSlot(tmp_path), SpoolSlot(tmp_path)
    assert (first.index, second.index) == (0, 1)
    Spool(second.directory).append(record(1))
    Spool(second.directory).append(record(2))
    assert first.depth() == 2
    assert first.orphans() == []  # its owner lives
    second.release()  # as a SIGKILL would
    orphans = first.orphans()
    assert [directory.name for directory, _ in orphans] == ["1"]
    assert SpoolSlot(tmp_path).index == 2  # while handed over, the slot is not free
    for _, fd in orphans:
        release_lock(fd)
    assert SpoolSlot(tmp_path).index == 1  # a restarted process takes the freed slot back
