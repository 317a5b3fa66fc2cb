"""Judge prompts and the parsing of their answers: PRM votes and OPD hints."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from claw_stream.events import ChatMessage, HintVote, Turn
from claw_stream.names import Vote
from claw_stream.skills.text import with_block

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
_THINK_END = "</think>"

# A vote ends at its box, a hint vote at its hint's end or at the box that declines one: stop
# strings that the built-in engine and vLLM both honour, each naming the one it met in the
# choice's `stop_reason` (the answer itself ends before it).
VOTE_STOPS = ("\\boxed{1}", "\\boxed{0}", "\\boxed{-1}")
HINT_STOPS = ("[HINT_END]", "\\boxed{-1}")


def final_answer(text: str) -> str | None:
    """What a judge said after its thinking: the text after the last `</think>`; None when it
    opened a `<think>` it never closed (cut off by max_tokens before its verdict)."""
    if _THINK_END in text:
        return text.rsplit(_THINK_END, 1)[1]
    if "<think>" in text:
        return None
    return text


def _reasoning(choice: dict[str, Any]) -> str:
    """The thinking a server with a reasoning parser hands apart from the content (vLLM:
    `reasoning_content`, `reasoning` in its later versions)."""
    message = choice.get("message") or {}
    return str(message.get("reasoning_content") or message.get("reasoning") or "")


def shows_thinking(choice: dict[str, Any]) -> bool:
    """Whether one choice of a judge's answer shows that the judge thinks before its verdict."""
    content = (choice.get("message") or {}).get("content") or ""
    return bool(_reasoning(choice).strip()) or "<think>" in content or _THINK_END in content


def with_stop(choice: dict[str, Any], stops: tuple[str, ...]) -> str | None:
    """A judge's answer from one choice of a request sent with `stops`, the stop string it met
    put back; None where the stop cannot be trusted: the server does not say which it met (a
    hosted API), or the judge met one inside its thinking (a draft box: a judge that thinks
    needs its room; behind a reasoning parser, the thinking holds all it wrote). The caller
    then asks without stops."""
    content = (choice.get("message") or {}).get("content") or ""
    if choice.get("finish_reason") != "stop":
        return content
    if "stop_reason" not in choice:
        return None
    met = choice["stop_reason"]
    if not isinstance(met, str) or met not in stops:
        return content  # its end of text
    if _reasoning(choice).strip() and not content.strip():
        return None
    text = content + met
    return text if final_answer(text) is not None else None


def parse_vote(text: str) -> Vote | None:
    """The last \\boxed{1|0|-1} of a judge's answer after any thinking (a box inside the
    thinking is a draft, not the verdict); None when there is none."""
    answer = final_answer(text)
    if answer is None:
        return None
    values = [_VOTES[v] for v in _BOXED.findall(answer) if v in _VOTES]
    return values[-1] if values else None


def majority(votes: list[Vote | None], threshold: float | None = None) -> Vote:
    """The most common vote; a tie, or no parseable vote, is 0. With a `threshold` (> 0.5), a
    verdict needs that share of the parsed votes, else 0 (3 votes at 0.7: all three agree)."""
    counted = Counter(v for v in votes if v is not None)
    if not counted:
        return 0
    if threshold is not None:
        top, n = counted.most_common(1)[0]
        return top if n / sum(counted.values()) >= threshold else 0
    (top, n), *rest = counted.most_common()
    return 0 if rest and rest[0][1] == n else top


def parse_hint(text: str) -> HintVote:
    """A hint vote: its \\boxed score (0 when there is none) and the hint between the markers,
    both from after any thinking."""
    match = _HINT.search(final_answer(text) or "")
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


@dataclass(frozen=True)
class JudgePrompt:
    """A judge's chat messages and how much of the history was left out to fit its context."""

    messages: list[dict[str, str]]
    history_cut: int  # oldest history messages left out
    chars: int


def _line(m: ChatMessage, label: str | None = None) -> str:
    calls = ", ".join(f"{c.function.name}({c.function.arguments})" for c in m.tool_calls or [])
    text = (m.content or "") + (" calls: " + calls if calls else "")
    return f"[{label or m.role}] {text}".rstrip()


def _clip(text: str, limit: int) -> str:
    """`text` within `limit` characters: its head and its tail, the middle marked as cut."""
    if len(text) <= limit:
        return text
    marker = f" [... {len(text) - limit} characters cut ...] "
    keep = max(0, limit - len(marker))
    return text[: keep // 2] + marker + text[len(text) - (keep - keep // 2) :]


def transcript(
    turn: Turn, budget_chars: int | None = None, feedback: list[str] | None = None
) -> tuple[str, int]:
    """The turn as the judge reads it, within `budget_chars`: (text, history messages cut).

    Kept whole, in this order of priority: the judged answer, the next state (the user's next
    message or the tool's result), the user's feedback on the answer, and the last user message
    the answer replied to; the history before it fills what is left, newest first, so the
    oldest is cut first. OpenClaw's prompts (8-18k tokens, `tests/fixtures/agents/openclaw/`) do not
    fit a small judge whole; an unbounded prompt made long sessions' judge calls fail.
    """
    history = [m for m in turn.step.request.messages if m.role not in ("system", "developer")]
    last_user = max((i for i, m in enumerate(history) if m.role == "user"), default=None)
    kept_head = [_line(history[last_user])] if last_user is not None else []
    older = history[:last_user] if last_user is not None else history
    after = history[last_user + 1 :] if last_user is not None else []
    answer = turn.step.response.message
    tail = [_line(m) for m in after]
    tail.append(_line(answer, "assistant answer"))
    tail += [_line(m, f"next state: {m.role}") for m in turn.next_state or []]
    tail += [f"[user feedback on this answer] {text}" for text in feedback or []]
    if budget_chars is None:
        lines = [_line(m) for m in older] + kept_head + tail
        return "\n".join(lines), 0
    # the essential part first, each piece clipped to a share of the budget if it alone is huge
    essential = kept_head + tail
    share = max(200, budget_chars // max(1, len(essential)))
    total = sum(len(x) + 1 for x in essential)
    if total > budget_chars:
        essential = [_clip(x, share) for x in essential]
        total = sum(len(x) + 1 for x in essential)
    kept: list[str] = []
    for m in reversed(older):
        line = _line(m)
        if total + len(line) + 1 > budget_chars:
            break
        kept.append(line)
        total += len(line) + 1
    cut = len(older) - len(kept)
    note = [f"[{cut} earlier messages left out]"] if cut else []
    return "\n".join(note + list(reversed(kept)) + essential), cut


def judge_prompt(
    system: str,
    turn: Turn,
    budget_chars: int | None = None,
    feedback: list[str] | None = None,
    template: str | None = None,
) -> JudgePrompt:
    """The built-in `system` prompt and the transcript as the user message; or, with a
    `template` (a prompt file, `prompt_files.py`), that one user message with the transcript in
    place of its {transcript}."""
    frame = template if template is not None else system
    room = None if budget_chars is None else max(400, budget_chars - len(frame) - 64)
    text, cut = transcript(turn, room, feedback)
    if template is not None:
        content = template.replace("{transcript}", text)
        return JudgePrompt([{"role": "user", "content": content}], cut, len(content))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return JudgePrompt(messages, cut, len(system) + len(text))


def prm_messages(turn: Turn) -> list[dict[str, str]]:
    return judge_prompt(PRM_SYSTEM, turn).messages


def opd_messages(turn: Turn) -> list[dict[str, str]]:
    return judge_prompt(OPD_SYSTEM, turn).messages


def served_messages(turn: Turn, skills: tuple[str, str] | None = None) -> list[ChatMessage]:
    """The Step's messages as the engine read them: with the skills block its call carried
    (`skills`: the block and its position), else as the client sent them."""
    messages = [m.model_copy() for m in turn.step.request.messages]
    if skills is None:
        return messages
    block, position = skills
    dumped = [m.model_dump(exclude_none=True) for m in messages]
    return [ChatMessage.model_validate(m) for m in with_block(dumped, block, position)]


def teacher_messages(
    turn: Turn, hint: str, skills: tuple[str, str] | None = None
) -> list[ChatMessage]:
    """The request as served (with its skills block, if any) and the hint appended to its last
    user message."""
    messages = served_messages(turn, skills)
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            messages[i] = messages[i].model_copy(
                update={"content": f"{messages[i].content or ''}\n\n[Hint] {hint}"}
            )
            return messages
    return [*messages, ChatMessage(role="user", content=f"[Hint] {hint}")]
