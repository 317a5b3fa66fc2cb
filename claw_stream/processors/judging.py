"""Judge prompts and the parsing of their answers: PRM votes and OPD hints."""

from __future__ import annotations

import re
from collections import Counter

from claw_stream.events import ChatMessage, HintVote, Turn
from claw_stream.names import Vote

_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)
MIN_HINT_CHARS = 10

PRM_SYSTEM = (
    "You judge one turn of an AI assistant by what happened next. You see the conversation, the "
    "assistant's answer, and the next state: the user's reply or the tool's result. Answer "
    "\\boxed{1} if the next state shows progress (the user moves on or thanks, the tool "
    "succeeded), \\boxed{-1} if it shows a problem (a correction, a request to redo, a complaint, "
    "a tool error), and \\boxed{0} if it is unclear. Think briefly, then give the box."
)
OPD_SYSTEM = (
    "You help an AI assistant learn from what happened next. If the next state shows how the "
    "answer should have been better, answer \\boxed{1} and a short hint for the assistant between "
    "[HINT_START] and [HINT_END]; otherwise answer \\boxed{-1}."
)


_VOTES: dict[str, Vote] = {"1": 1, "0": 0, "-1": -1}


def parse_vote(text: str) -> Vote | None:
    """The last \\boxed{1|0|-1} in a judge's answer; None when there is none."""
    values = [_VOTES[v] for v in _BOXED.findall(text) if v in _VOTES]
    return values[-1] if values else None


def majority(votes: list[Vote | None]) -> Vote:
    """The most common vote; a tie, or no parseable vote, is 0."""
    counted = Counter(v for v in votes if v is not None)
    if not counted:
        return 0
    (top, n), *rest = counted.most_common()
    return 0 if rest and rest[0][1] == n else top


def parse_hint(text: str) -> HintVote:
    """A hint vote: its \\boxed score (0 when there is none) and the hint between the markers."""
    match = _HINT.search(text)
    score = parse_vote(text)
    return HintVote(
        score=score if score is not None else 0,
        hint=match.group(1).strip() if match else None,
        raw=text,
    )


def choose_hint(votes: list[HintVote]) -> str | None:
    """The longest hint of a vote that accepted (score 1) with more than 10 characters."""
    accepted = [v.hint for v in votes if v.score == 1 and v.hint and len(v.hint) > MIN_HINT_CHARS]
    return max(accepted, key=len) if accepted else None


def _transcript(turn: Turn) -> str:
    lines = []
    for m in turn.step.request.messages:
        if m.role in ("system", "developer"):
            continue
        lines.append(f"[{m.role}] {m.content or ''}".rstrip())
    answer = turn.step.response.message
    calls = ", ".join(f"{c.function.name}({c.function.arguments})" for c in answer.tool_calls or [])
    lines.append(f"[assistant answer] {answer.content or ''}{' calls: ' + calls if calls else ''}")
    for m in turn.next_state or []:
        lines.append(f"[next state: {m.role}] {m.content or ''}")
    return "\n".join(lines)


def prm_messages(turn: Turn) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": PRM_SYSTEM},
        {"role": "user", "content": _transcript(turn)},
    ]


def opd_messages(turn: Turn) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": OPD_SYSTEM},
        {"role": "user", "content": _transcript(turn)},
    ]


def teacher_messages(turn: Turn, hint: str) -> list[ChatMessage]:
    """The same request with the hint appended to its last user message."""
    messages = [m.model_copy() for m in turn.step.request.messages]
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            messages[i] = messages[i].model_copy(
                update={"content": f"{messages[i].content or ''}\n\n[Hint] {hint}"}
            )
            return messages
    return [*messages, ChatMessage(role="user", content=f"[Hint] {hint}")]
