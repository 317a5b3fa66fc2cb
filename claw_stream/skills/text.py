"""The text rules of skills: when two lessons are one, the marked block a prompt carries, and
where in the messages it goes.

The block goes after the text of the first user message (`skills.position: first_user`), or at
the end of the first system message (`system`). Either way it is the same on every call of a
session until a skill changes, so the engine's prefix cache keeps the session's prompt and each
call's prompt ids continue the last one's. `first_user` is the default: the agent's own system
prompt before it stays shared across sessions, and a small model follows a lesson said in the
user's turn where it overlooks one in the system prompt (SmolLM2-135M on the demo's 24 held-out
questions, "Answer in under 30 words.": 0 answers short without it, 6 with it in the system
prompt, 16 after the user's question; bench/skills_position_bench.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SKILLS_FIELD = "claw_skills"  # in a Step's request.extra: {ids, block, position}
OPEN = "<claw-skills>"
CLOSE = "</claw-skills>"
HEADER = "Lessons from this user's earlier conversations; follow them:"
CHARS_PER_TOKEN = 4  # English prose in the small models' tokenizers: ~4.2 (SmolLM2, measured)
MAX_CHARS = 300  # a skill is a lesson, not a document
_WORD = re.compile(r"[a-z0-9']+")
# words that say nothing about what a lesson asks
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "to",
        "of",
        "in",
        "on",
        "for",
        "is",
        "are",
        "be",
        "it",
        "this",
        "that",
        "please",
        "you",
        "your",
        "i",
        "me",
        "my",
        "with",
        "as",
        "at",
        "by",
        "do",
    ]
)


def words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOP)


def similarity(a: str, b: str) -> float:
    """Jaccard overlap of the two lessons' words: 1.0 for the same words in any order."""
    wa, wb = words(a), words(b)
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa | wb)


def clean(text: str) -> str:
    """One line, trimmed to MAX_CHARS at a word, ending as a sentence."""
    one = " ".join(text.split())
    if len(one) > MAX_CHARS:
        one = one[:MAX_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    if one and one[-1] not in ".!?…":
        one += "."
    return one[:1].upper() + one[1:]


@dataclass(frozen=True)
class Chosen:
    skill_id: str
    text: str


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def fit(candidates: Sequence[Chosen], max_tokens: int, max_skills: int) -> list[Chosen]:
    """The candidates, best first, that fit the token budget with the block's frame."""
    budget = max_tokens - estimate_tokens(f"{OPEN}\n{HEADER}\n{CLOSE}")
    chosen: list[Chosen] = []
    for skill in candidates:
        cost = estimate_tokens(f"- {skill.text}\n")
        if len(chosen) >= max_skills or cost > budget:
            continue
        chosen.append(skill)
        budget -= cost
    return chosen


def render(chosen: Sequence[Chosen]) -> str:
    lines = "\n".join(f"- {skill.text}" for skill in chosen)
    return f"{OPEN}\n{HEADER}\n{lines}\n{CLOSE}"


def with_block(
    messages: list[dict[str, Any]], block: str, position: str = "first_user"
) -> list[dict[str, Any]]:
    """A copy of a chat request's messages carrying `block` (the client's list is untouched):
    after the text of the first user message (`first_user`), or of the first system message
    (`system`, a system message of its own where there is none)."""
    roles = ("user",) if position == "first_user" else ("system", "developer")
    for i, message in enumerate(messages):
        if message.get("role") not in roles:
            continue
        content = message.get("content")
        if isinstance(content, str):
            joined: Any = f"{content}\n\n{block}" if content else block
        elif isinstance(content, list):
            joined = [*content, {"type": "text", "text": f"\n\n{block}"}]
        else:
            break
        return [*messages[:i], {**message, "content": joined}, *messages[i + 1 :]]
    return [{"role": "system", "content": block}, *messages]


def carried_block(extra: dict[str, Any]) -> tuple[str, str] | None:
    """The skills block a Step's call carried and where it went ((block, position)), from its
    request's `extra`; None when it carried none."""
    note = extra.get(SKILLS_FIELD)
    if not isinstance(note, dict) or not isinstance(note.get("block"), str) or not note["block"]:
        return None
    return note["block"], str(note.get("position") or "first_user")


def query_of(messages: Sequence[dict[str, Any]]) -> str:
    """What a session is about, for ranking skills: its first user message's text."""
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content[:2000]
        if isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            return " ".join(t for t in texts if isinstance(t, str))[:2000]
    return ""
