"""The user's reaction to an answer, read from what they said next: a reward source.

A 135M PRM cannot read a next state: on a real OpenClaw conversation SmolLM2 voted 0, 0, 0 on
"Thanks, that is right." and on "Perfect, exactly what I wanted. Thank you!", so nothing
trained. What the user says right after an answer is the plainest signal there is, and a
lexicon reads it in microseconds: VADER (`vaderSentiment`, a lexicon and rules tuned to short
social text) for the tone, and a short list of cue phrases for what tone misses (a correction
is often said calmly: "No, it is 12." reads neutral to VADER, and "Thanks" alone is not much
warmer). The source abstains where the user said nothing (only tool results followed), asked
something new without judging the answer, or said something neither warm nor cold: then the
PRM (or whatever comes next in `precedence`) decides.

Measured on the labelled next states of `bench/data/reactions.jsonl` by
`bench/judge_agreement_bench.py` (docs/benchmarks.md, "Judges").
"""

from __future__ import annotations

import functools
import re
from typing import Any

from claw_stream.api.reward_source import Metadata, Score
from claw_stream.events import ChatMessage, Turn

# what agents wrap around a user's words: OpenClaw's internal context, Claude Code's reminders
_WRAPPERS = re.compile(
    r"<<<BEGIN_[A-Z_]+>>>.*?<<<END_[A-Z_]+>>>|<system-reminder>.*?</system-reminder>", re.DOTALL
)
# a correction: said at the start, or plainly anywhere
_CORRECTION = re.compile(
    r"^\W*(?:no\b(?!\s+(?:problem|worries))|nope\b|wrong\b|incorrect\b|not quite\b"
    r"|not really\b|actually\b|hmm,? no\b)"
    r"|\b(?:that(?:'s| is) (?:not|wrong|incorrect)|(?:is|was|are) (?:wrong|incorrect)"
    r"|you(?:'re| are) wrong|isn't right"
    r"|is not right|doesn't work|does not work|didn't work|did not work|still (?:wrong|broken"
    r"|fails|failing|doesn't)|not what i (?:asked|wanted|meant)|try again|that's a mistake"
    r"|you made a mistake|you misunderstood|that's incorrect|nonsense|useless)\b",
    re.IGNORECASE,
)
_APPROVAL = re.compile(
    r"\b(?:thanks|thank you|thx|perfect|exactly|great|correct|that(?:'s| is) (?:right|it)"
    r"|right answer|that works|works now|it works|looks good|lgtm|awesome|excellent|nice"
    r"|well done|good job|spot on|brilliant|love it|helpful)\b",
    re.IGNORECASE,
)
TONE = 0.5  # |VADER compound| from which tone alone decides (it lies in [-1, 1])


@functools.cache
def _analyzer() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def user_words(next_state: list[ChatMessage] | None) -> str:
    """What the user said after the answer: the next state's user messages, without what
    their agent wrapped around them; "" when only tool results followed."""
    texts = []
    for message in next_state or ():
        if message.role == "user" and message.content:
            text = _WRAPPERS.sub(" ", message.content).strip()
            if text:
                texts.append(text)
    return "\n".join(texts)


def reaction(text: str) -> Score | None:
    """+1 for approval, -1 for a correction, the tone where it is strong; None (abstain) where
    the words do not judge the answer."""
    if not text:
        return None
    head = text[:600]  # a long message is a new request; its first lines say what it thinks
    if match := _CORRECTION.search(head):
        return Score(-1.0, f"correction: {match.group(0).strip()!r}")
    tone = float(_analyzer().polarity_scores(head)["compound"])
    # a lone question ("Is this correct?") judges nothing
    question = head.rstrip().endswith("?") and not re.search(r"[.!]\s", head)
    if (match := _APPROVAL.search(head)) and not question and tone > -TONE:
        return Score(1.0, f"approval: {match.group(0)!r} (tone {tone:+.2f})")
    if abs(tone) >= TONE:
        return Score(round(tone, 4), f"tone {tone:+.2f}")
    return None


def score(turn: Turn, metadata: Metadata) -> Score | None:
    """The `reaction` reward source (`worker.rewards: [{use: reaction}]`), a
    `claw_stream.api.Scorer`."""
    return reaction(user_words(turn.next_state))
