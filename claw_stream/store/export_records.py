"""What `claw-stream export` writes for one archived sample (and its step): pure mappings, no
database, so the row → record rules and the DPO pairing are tested on their own.

Every record of a format has the same keys (absent values are null), so a JSONL file and a
Parquet file of the same rows read back equal. Messages keep every field of `ChatMessage`;
a request's tools are JSON text (their schemas are free-form, a Parquet column is not)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from claw_stream.events import ChatMessage, Sample, Step

Format = Literal["sft", "dpo", "rl"]
FORMATS: tuple[Format, ...] = ("sft", "dpo", "rl")
Record = dict[str, Any]


@dataclass(frozen=True)
class Row:
    """One archived sample with the step it was made from."""

    sample: Sample
    step: Step


def message(m: ChatMessage) -> dict[str, Any]:
    return m.model_dump(mode="json", exclude_none=False)


def prompt_messages(step: Step) -> list[dict[str, Any]]:
    return [message(m) for m in step.request.messages]


def tools_text(step: Step) -> str | None:
    return json.dumps(step.request.tools) if step.request.tools else None


def sft_record(row: Row) -> Record:
    s = row.sample
    return {
        "sample_id": str(s.sample_id),
        "session_id": s.session_id,
        "step_id": str(s.step_id),
        "reward": s.reward,
        "weight_version": s.weight_version,
        "messages": [*prompt_messages(row.step), message(row.step.response.message)],
        "tools": tools_text(row.step),
    }


def rl_record(row: Row) -> Record:
    s = row.sample
    return {
        "sample_id": str(s.sample_id),
        "session_id": s.session_id,
        "group_id": s.group_id,
        "step_id": str(s.step_id),
        "turn_id": str(s.turn_id),
        "method": s.method,
        "prompt_token_ids": list(s.prompt_token_ids),
        "response_token_ids": list(s.response_token_ids),
        "response_logprobs": list(s.response_logprobs),
        "teacher_logprobs": None if s.teacher_logprobs is None else list(s.teacher_logprobs),
        "reward": s.reward,
        "reward_source": s.reward_source,
        "weight_version": s.weight_version,
        "released_at_version": s.released_at_version,
    }


def dpo_record(chosen: Row, rejected: Row) -> Record:
    return {
        "prompt": prompt_messages(chosen.step),
        "chosen": [message(chosen.step.response.message)],
        "rejected": [message(rejected.step.response.message)],
        "tools": tools_text(chosen.step),
        "chosen_reward": chosen.sample.reward,
        "rejected_reward": rejected.sample.reward,
        "chosen_sample_id": str(chosen.sample.sample_id),
        "rejected_sample_id": str(rejected.sample.sample_id),
    }


def prompt_key(step: Step) -> str:
    """Two turns answer the same prompt when their rendered prompt messages and tools are equal."""
    return json.dumps([prompt_messages(step), step.request.tools], sort_keys=True)


def dpo_pairs(rows: Iterable[Row]) -> Iterator[Record]:
    """Pairs of answers to the same prompt with opposite rewards (chosen > 0 > rejected).

    Each answer is used once: the best rewarded is paired with the worst, the next with the
    next, in order of reward (then of arrival); answers with the same text are not a pair."""
    by_prompt: dict[str, list[Row]] = {}
    for row in rows:
        by_prompt.setdefault(prompt_key(row.step), []).append(row)
    for group in by_prompt.values():
        chosen = sorted((r for r in group if r.sample.reward > 0), key=lambda r: -r.sample.reward)
        rejected = sorted((r for r in group if r.sample.reward < 0), key=lambda r: r.sample.reward)
        for good, bad in zip(chosen, rejected, strict=False):
            if message(good.step.response.message) != message(bad.step.response.message):
                yield dpo_record(good, bad)


def keep(row: Row, fmt: Format, min_reward: float | None) -> bool:
    """SFT keeps turns rewarded at least `min_reward` (default: above 0); RL keeps every
    sample unless `min_reward` is given; DPO pairs by sign and ignores it."""
    if fmt == "sft":
        return row.sample.reward > 0 if min_reward is None else row.sample.reward >= min_reward
    if fmt == "rl":
        return min_reward is None or row.sample.reward >= min_reward
    return True
