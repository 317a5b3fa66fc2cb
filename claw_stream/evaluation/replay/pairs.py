"""The held-out replay's pure part: a held-out turn asked again, the pair (the answer the user
got, the new version's answer) scored by a rule or by a judge in both orders, and how well a
judge agrees with a rule.

A pair's score is the new answer's: 1 it wins, 1/2 a tie, 0 it loses. The judge sees the
conversation, both answers (as A and B) and what the user said next after the answer they got:
the next state says what they wanted. Each vote is asked in both orders, because a small judge
picks a position more than an answer (SmolLM2-135M answered "A" to nearly every pair).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from claw_stream.dialect import flatten_content
from claw_stream.evaluation.intervals import Share, wilson

Preference = Literal["A", "B", "tie"]
Order = Literal["new_first", "old_first"]

PAIR_SYSTEM = (
    "You compare two answers an assistant could give at the same point of a conversation. "
    "You see the conversation so far, answer A, answer B, and what the user said after the "
    "answer they were given: it tells what the user wanted. Decide which answer the user "
    "would have preferred. Reply with one word: A, B or TIE."
)
CLIP_CHARS = 1500  # each piece of the comparison; a 135M judge has a 2k-token window
# a vote is the answer's first word, alone or closed by punctuation ("B.", "A:", "TIE"), or
# followed by a verb ("B is better"); "A black hole is..." (an article) and "A, B or TIE" (the
# options read back) name no answer: SmolLM2-135M wrote both, measured
_PICK = re.compile(
    r"^\W*(?:answer\s+)?(A|B|TIE)(?:\W*$|[.!:;)\n]|\s+(?:is|was|wins|would|did)\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class HeldOutTurn:
    """A main-line turn the worker held out of training (`eval.holdout_share`)."""

    turn_id: uuid.UUID
    session_id: str
    key_hash: str | None
    served_version: int  # the version that gave the user `answer`
    request: dict[str, Any]  # the Step's request: messages, tools, sampling
    answer: str
    next_state: str | None  # what the user (or a tool) said next; None: the conversation ended


@dataclass(frozen=True)
class PairScore:
    """One held-out turn answered again by `version`, scored against the answer the user got."""

    turn: HeldOutTurn
    version: int
    answer: str
    score: float  # the scorer's: 1 the new answer wins, 1/2 tie, 0 it loses
    scorer: str  # "rule:<name>" | "judge:<model>"
    rule_score: float | None = None
    judge_score: float | None = None
    judge: str | None = None  # the judge model, where it was asked
    votes: int = 0  # judge votes that named an answer (both orders)


def outcome(score: float) -> Literal["win", "tie", "loss"]:
    return "win" if score > 0.5 else "loss" if score < 0.5 else "tie"


def won(score: float) -> float:
    """A pair's score as a win rate counts it: a win 1, a tie 1/2, a loss 0."""
    return {"win": 1.0, "tie": 0.5, "loss": 0.0}[outcome(score)]


class Scored(Protocol):
    @property
    def version(self) -> int: ...
    @property
    def scorer(self) -> str: ...
    @property
    def score(self) -> float: ...


def by_version_and_scorer(scored: Iterable[Scored]) -> dict[tuple[int, str], list[float]]:
    """The pair scores of each version and scorer, in order."""
    out: dict[tuple[int, str], list[float]] = {}
    for s in scored:
        out.setdefault((s.version, s.scorer), []).append(s.score)
    return dict(sorted(out.items()))


def _clip(text: str) -> str:
    return text if len(text) <= CLIP_CHARS else text[: CLIP_CHARS // 2] + " [...] " + text[-200:]


def message_text(message: dict[str, Any]) -> str:
    """A chat message as text: its content (parts joined) and its tool calls."""
    try:
        text = flatten_content(message.get("content"))
    except ValueError:
        text = str(message.get("content"))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += f" [tool call {fn.get('name')}({fn.get('arguments')})]"
    return text.strip()


def conversation(request: dict[str, Any], last: int = 6) -> str:
    """The conversation the answer replied to, its last `last` messages (no system prompt)."""
    shown = [m for m in request.get("messages", []) if m.get("role") not in ("system", "developer")]
    return "\n".join(f"[{m.get('role')}] {_clip(message_text(m))}" for m in shown[-last:])


def pair_messages(turn: HeldOutTurn, new_answer: str, order: Order) -> list[dict[str, str]]:
    """The judge's prompt for one vote; `order`: which answer is A."""
    a, b = (new_answer, turn.answer) if order == "new_first" else (turn.answer, new_answer)
    given = "A" if order == "old_first" else "B"
    after = turn.next_state or "(nothing: the conversation ended there)"
    text = (
        f"Conversation:\n{conversation(turn.request)}\n\n"
        f"Answer A:\n{_clip(a)}\n\nAnswer B:\n{_clip(b)}\n\n"
        f"The user was given answer {given}, and then said:\n{_clip(after)}\n\n"
        "Which answer did the user want? Write only A, B or TIE."
    )
    return [{"role": "system", "content": PAIR_SYSTEM}, {"role": "user", "content": text}]


def parse_preference(text: str) -> Preference | None:
    """The answer the judge named; None: it named none (no vote)."""
    found = _PICK.match(text or "")
    if found is None:
        return None
    word = found.group(1).upper()
    return "tie" if word == "TIE" else "A" if word == "A" else "B"


def vote_score(preference: Preference, order: Order) -> float:
    """A vote as the new answer's score."""
    if preference == "tie":
        return 0.5
    new_is_a = order == "new_first"
    return 1.0 if (preference == "A") == new_is_a else 0.0


def judged(votes: Iterable[tuple[Preference | None, Order]]) -> tuple[float | None, int]:
    """The mean of the votes that parsed (both orders), and how many; None: no vote parsed.
    A judge that always names the same position scores every pair 1/2, a tie: its position
    bias cancels instead of deciding."""
    scores = [vote_score(p, o) for p, o in votes if p is not None]
    return (sum(scores) / len(scores) if scores else None), len(scores)


def rule_pair(new: float, old: float) -> float:
    """A rule's scores of the two answers as the new answer's pair score."""
    return 1.0 if new > old else 0.0 if new < old else 0.5


@dataclass(frozen=True)
class Agreement:
    """How often a judge's pair verdict matched a rule's, on the pairs the rule decided (it
    scored one answer above the other). A coin agrees on half; a judge whose every vote
    cancels (a tie) agrees on none."""

    judge: str
    agreed: Share

    @property
    def reliable(self) -> bool:
        """Better than a coin beyond the interval."""
        return self.agreed.n > 0 and self.agreed.low > 0.5

    def words(self) -> str:
        a = self.agreed
        return (
            f"the judge {self.judge} agreed with the rule on {a.k} of {a.n} pairs it decided "
            f"({a.value:.0%} [{a.low:.0%}, {a.high:.0%}]; a coin: 50%)"
        )


def agreement(judge: str, pairs: Sequence[tuple[float, float | None]]) -> Agreement:
    """`pairs`: (rule score, judge score) of the same pairs; a judge score None (no vote
    parsed) agrees with nothing."""
    decided = [(r, j) for r, j in pairs if r != 0.5]
    agreed = sum(j is not None and outcome(j) == outcome(r) for r, j in decided)
    return Agreement(judge, wilson(agreed, len(decided)))


def unreliable_note(found: Agreement) -> str:
    return (
        f"replay judged by {found.judge} is unreliable: {found.words()}; its win rates are "
        "not shown as findings. A separate, larger judge model would do: "
        "`claw-stream eval --replay --judge-url URL`"
    )
