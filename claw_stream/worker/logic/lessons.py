"""The lessons a judged turn teaches, before they are skills (`claw_stream/skills/`).

- correction: the user's next words judged the answer wrong (the reaction source's rule) and
  said what to do instead ("That is too long. Please answer in under 30 words." teaches
  "Answer in under 30 words."); a bare "No, that is wrong." teaches nothing by itself;
- feedback: the text of `/rl/feedback` on the turn, its instructions (or all of it, when short);
- hint: the judge's hint on an answer scored wrong: what the answer should have done.

Only instructions become lessons: sentences that ask for something ("please …", "always …",
"use …", "I prefer …"), since a skill is said to the model before every answer of that user.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from claw_stream.events import Judgement
from claw_stream.skills.lesson import Lesson
from claw_stream.worker.reaction import reaction, user_words

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_POLITE = re.compile(r"^(?:please|pls|kindly)\s*,?\s+|,?\s+please(?=[.!?]?$)", re.IGNORECASE)
# a preference said outright; an imperative alone ("Explain how a rainbow forms.") is the
# next request, not a lesson
_ASKS = re.compile(
    r"\bplease\b|^(?:always|never|don'?t|do not|avoid|stop|from now on|next time|in future"
    r"|in the future|remember)\b|^keep (?:it|them|your|answers|the answers?)\b"
    r"|^be (?:more|less|brief|concise|short|shorter|clear|clearer|specific|precise)\b"
    r"|^i(?: would|'d)? (?:prefer|want|need|like)\b|\binstead\b",
    re.IGNORECASE,
)
# the answer judged without a correction's words: "That is too long." "It's not what I need."
_DISLIKE = re.compile(
    r"^\W*(?:that(?:'s| is| was)|it(?:'s| is| was)|this is|your answer (?:is|was))\s+"
    r"(?:too|way too|far too|a bit too|much too|not)\b",
    re.IGNORECASE,
)
MIN_WORDS = 3  # "Be brief." is the shortest lesson worth a line
SHORT_FEEDBACK_WORDS = 25  # feedback this short is the lesson itself


def instructions(text: str) -> list[str]:
    """The sentences of `text` that ask for something, without "please"."""
    found = []
    for sentence in _SENTENCE.split(text.strip()):
        sentence = sentence.strip().strip("\"'")
        if len(sentence.split()) < MIN_WORDS or sentence.endswith("?"):
            continue
        if _ASKS.search(sentence):
            polite = _POLITE.sub("", sentence).strip()
            if len(polite.split()) >= MIN_WORDS - 1:
                found.append(polite[:1].upper() + polite[1:])
    return found


def lessons(judgement: Judgement, sources: Collection[str]) -> list[Lesson]:
    turn = judgement.turn
    step = turn.step
    if step.turn_type != "main" or not step.train:
        return []  # a side call's or an untrained session's words are not the user's lessons

    def lesson(text: str, source: str) -> Lesson:
        return Lesson(text, source, judgement.session_id, str(step.step_id), str(turn.turn_id))

    out: list[Lesson] = []
    said = user_words(turn.next_state)
    judged = reaction(said)
    scored_wrong = (
        (judged is not None and judged.score < 0)
        or (judgement.prm_score is not None and judgement.prm_score < 0)
        or (judgement.feedback_score is not None and judgement.feedback_score < 0)
        or (judgement.explicit_reward is not None and judgement.explicit_reward < 0)
    )
    # the user's words judged the answer: a correction, or a dislike said calmly
    disliked = (judged is not None and judged.score < 0) or bool(_DISLIKE.search(said))
    if "correction" in sources and said and (disliked or scored_wrong):
        out += [lesson(t, "correction") for t in instructions(said[:600])[:2]]
    if "feedback" in sources and judgement.feedback_text:
        text = judgement.feedback_text.strip()
        asked = instructions(text)
        if not asked and (judgement.feedback_score or 0) < 0:
            asked = [text] if MIN_WORDS <= len(text.split()) <= SHORT_FEEDBACK_WORDS else []
        out += [lesson(t, "feedback") for t in asked[:2]]
    if "hint" in sources and judgement.hint and scored_wrong:
        out.append(lesson(judgement.hint, "hint"))
    return out
