"""A step's next state: what the following main-line step added after the assistant's answer."""

from __future__ import annotations

from dataclasses import dataclass

from claw_stream.events import ChatMessage, Step


@dataclass(frozen=True)
class NextState:
    messages: list[ChatMessage]
    exact: bool  # False: the answer was not found in the next request (history rewritten)


def _same_answer(message: ChatMessage, answer: ChatMessage) -> bool:
    if message.role != "assistant":
        return False
    if answer.tool_calls:
        ids = {c.id for c in answer.tool_calls}
        if message.tool_calls and ids & {c.id for c in message.tool_calls}:
            return True
    return (message.content or "").strip() == (answer.content or "").strip() and (
        bool(message.tool_calls) == bool(answer.tool_calls)
    )


def next_state(step: Step, following: Step) -> NextState | None:
    """The messages `following` adds after `step`'s answer; None when it adds nothing.

    The answer is looked for from the end, so an agent that retried a turn with edited text
    (OpenClaw rewrites a queued user message) still stitches. If the agent compacted or
    rewrote its history and the answer is gone, the messages after the last assistant message
    are taken instead, marked inexact.
    """
    messages = following.request.messages
    answer = step.response.message
    for i in range(len(messages) - 1, -1, -1):
        if _same_answer(messages[i], answer):
            added = messages[i + 1 :]
            return NextState(list(added), exact=True) if added else None
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    added = [m for m in messages[last_assistant + 1 :] if m.role in ("user", "tool")]
    return NextState(added, exact=False) if added else None
