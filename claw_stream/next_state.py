"""A turn's next state: what the conversation's next call added after the assistant's answer.

The one rule, for the worker (its turns, which the judge reads), the held-out replay and the
console, which read the same two archived steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from claw_stream.events import ChatMessage


@dataclass(frozen=True)
class NextState:
    messages: list[ChatMessage]
    exact: bool  # False: the answer was not found in the next request (history rewritten)


def same_answer(message: ChatMessage, answer: ChatMessage) -> bool:
    """Whether `message` is the assistant's `answer` as the agent put it back in its history
    (a tool call by its id, else the same text)."""
    if message.role != "assistant":
        return False
    if answer.tool_calls:
        ids = {c.id for c in answer.tool_calls}
        if message.tool_calls and ids & {c.id for c in message.tool_calls}:
            return True
    return (message.content or "").strip() == (answer.content or "").strip() and (
        bool(message.tool_calls) == bool(answer.tool_calls)
    )


def next_state(answer: ChatMessage, following: Sequence[ChatMessage]) -> NextState | None:
    """The messages the next call (`following`, its request's messages) adds after `answer`;
    None when it adds nothing.

    The answer is looked for from the end, so an agent that retried a turn with edited text
    (OpenClaw rewrites a queued user message) still stitches. If the agent compacted or
    rewrote its history and the answer is gone, the user and tool messages after the last
    assistant message are taken instead, marked inexact.
    """
    for i in range(len(following) - 1, -1, -1):
        if same_answer(following[i], answer):
            added = following[i + 1 :]
            return NextState(list(added), exact=True) if added else None
    last_assistant = max((i for i, m in enumerate(following) if m.role == "assistant"), default=-1)
    added = [m for m in following[last_assistant + 1 :] if m.role in ("user", "tool")]
    return NextState(added, exact=False) if added else None


def archived_next_state(step: dict[str, Any], following: dict[str, Any] | None) -> NextState | None:
    """`next_state` of two archived steps (a Step's JSON, as `step_payloads` keeps it): `step`'s
    answer in `following`'s request; None without a following step."""
    if following is None:
        return None
    answer = ChatMessage.model_validate(step["response"]["message"], strict=False)
    messages = following["request"]["messages"]
    return next_state(answer, [ChatMessage.model_validate(m, strict=False) for m in messages])
