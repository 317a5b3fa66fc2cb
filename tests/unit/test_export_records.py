"""Row → record mappings of `claw-stream export`, the DPO pairing, the shared time filter and
the lag arithmetic: pure logic, no services."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from claw_stream.bus.lag import partition_lag
from claw_stream.store.export_records import Row, dpo_pairs, keep, rl_record, sft_record
from claw_stream.timerange import TimeRange, parse_time

from ..support.factories import answered, make_step, sample_of


def row(content: str, reward: float, prompt: str | None = None) -> Row:
    step = answered(make_step(), content, prompt)
    return Row(sample_of(step, reward), step)


def test_sft_record_is_the_prompt_then_the_answer() -> None:
    step = make_step()  # an answer with a tool call, and a request with tools
    r = Row(sample_of(step, 1.0), step)
    record = sft_record(r)
    assert [m["role"] for m in record["messages"]] == ["developer", "user", "assistant"]
    assert record["messages"][0]["content"] == "You are terse."
    assert record["messages"][-1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    ]
    assert set(record["messages"][0]) == {
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "reasoning_content",
    }
    assert json.loads(record["tools"]) == step.request.tools
    assert (record["sample_id"], record["step_id"], record["reward"]) == (
        str(r.sample.sample_id),
        str(step.step_id),
        1.0,
    )


def test_rl_record_holds_the_sampled_tokens_and_reward() -> None:
    r = row("fine", -1.0)
    record = rl_record(r)
    assert record["prompt_token_ids"] == [1, 2, 3, 4]
    assert record["response_token_ids"] == [10, 11, 12]
    assert record["response_logprobs"] == [-0.1, -2.5, -0.01]
    assert record["teacher_logprobs"] is None
    assert (record["reward"], record["reward_source"], record["method"]) == (-1.0, "prm", "binary")


def test_min_reward_filters_sft_and_rl_only() -> None:
    good, neutral, bad = row("a", 1.0), row("b", 0.0), row("c", -1.0)
    assert [keep(r, "sft", None) for r in (good, neutral, bad)] == [True, False, False]
    assert [keep(r, "sft", 0.0) for r in (good, neutral, bad)] == [True, True, False]
    assert [keep(r, "rl", None) for r in (good, neutral, bad)] == [True, True, True]
    assert [keep(r, "rl", 0.5) for r in (good, neutral, bad)] == [True, False, False]


def test_dpo_pairs_opposite_rewards_on_the_same_prompt() -> None:
    rows = [
        row("right", 1.0),
        row("wrong", -1.0),
        row("also right", 0.5),
        row("lonely", 1.0, prompt="Another question"),  # no rejected answer to its prompt
        row("other wrong", -1.0, prompt="A third question"),
        row("meh", 0.0),  # no sign: never a side of a pair
    ]
    pairs = list(dpo_pairs(rows))
    assert len(pairs) == 1  # one rejected answer: used once, with the best chosen one
    (pair,) = pairs
    assert pair["chosen"][0]["content"] == "right"
    assert pair["rejected"][0]["content"] == "wrong"
    assert (pair["chosen_reward"], pair["rejected_reward"]) == (1.0, -1.0)
    assert [m["content"] for m in pair["prompt"]] == ["You are terse.", "List the files."]


def test_dpo_pairs_each_answer_once_best_with_worst() -> None:
    rows = [row("ok", 0.5), row("bad", -0.2), row("best", 1.0), row("worst", -1.0)]
    pairs = [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in dpo_pairs(rows)]
    assert pairs == [("best", "worst"), ("ok", "bad")]


def test_dpo_skips_the_same_answer_rewarded_both_ways() -> None:
    assert list(dpo_pairs([row("same", 1.0), row("same", -1.0)])) == []


def test_time_range_parses_like_replay_did() -> None:
    window = TimeRange.parse("2026-11-23T10:00", "2026-11-23T11:00")
    assert window.since == datetime(2026, 11, 23, 10, tzinfo=UTC)
    assert datetime(2026, 11, 23, 10, 30, tzinfo=UTC) in window
    assert datetime(2026, 11, 23, 11, tzinfo=UTC) not in window  # until is exclusive
    ago = datetime.now(UTC) - parse_time("2h")
    assert abs(ago - timedelta(hours=2)) < timedelta(seconds=5)
    with pytest.raises(ValueError, match="neither an ISO time"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="--until must be after --since"):
        TimeRange.parse("1h", "2h")


def test_partition_lag() -> None:
    assert partition_lag(end=10, committed=4, first=0) == 6
    assert partition_lag(end=10, committed=None, first=3) == 7  # the group never committed
    assert partition_lag(end=10, committed=-1, first=0) == 10
    assert partition_lag(end=8, committed=10, first=0) == 0  # a short end offset (Tansu)
