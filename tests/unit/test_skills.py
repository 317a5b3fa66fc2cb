"""Skills' pure rules: which words of a judged turn are a lesson, when two lessons are one, the
block a prompt carries and where it goes."""

from __future__ import annotations

from claw_stream.events import ChatMessage
from claw_stream.gateway.skills import caller
from claw_stream.skills.config import SOURCES
from claw_stream.skills.scope import ANONYMOUS, POLICY, scopes_of, user_scope
from claw_stream.skills.text import (
    CLOSE,
    OPEN,
    Chosen,
    clean,
    estimate_tokens,
    fit,
    query_of,
    render,
    similarity,
    with_block,
)
from claw_stream.store.consent import hash_key
from claw_stream.worker.logic.lessons import instructions, lessons

from ..support.factories import make_judgement, make_step, make_turn


def judged(next_words: str, **changes: object):
    step = make_step("s-1")
    step = step.model_copy(update={"response": step.response.model_copy()})
    turn = make_turn(step).model_copy(
        update={"next_state": [ChatMessage(role="user", content=next_words)]}
    )
    judgement = make_judgement(turn).model_copy(update={"hint": None, "prm_score": None, **changes})
    return judgement


def test_a_correction_teaches_what_the_user_asked_for_not_their_next_question() -> None:
    found = lessons(
        judged("That is too long. Please answer in under 30 words. Explain how a rainbow forms."),
        SOURCES,
    )
    assert [(x.text, x.source) for x in found] == [("Answer in under 30 words.", "correction")]
    assert found[0].session_id == "s-1" and found[0].turn_id is not None


def test_words_that_ask_for_nothing_teach_nothing() -> None:
    assert lessons(judged("No, that is wrong."), SOURCES) == []
    assert lessons(judged("Thanks, that is right. Explain how a rainbow forms."), SOURCES) == []
    # an instruction said while liking the answer is the next request, not a lesson
    assert lessons(judged("Perfect, thanks! Please list the files."), SOURCES) == []


def test_an_instruction_after_a_thumbs_down_is_a_lesson() -> None:
    found = lessons(judged("I prefer answers in French.", feedback_score=-1), SOURCES)
    assert [x.text for x in found] == ["I prefer answers in French."]


def test_feedback_text_and_the_judges_hint_on_a_wrong_answer() -> None:
    found = lessons(
        judged("ok", feedback_text="Always cite the file you changed.", feedback_score=-1),
        SOURCES,
    )
    assert [(x.text, x.source) for x in found] == [
        ("Always cite the file you changed.", "feedback")
    ]
    hinted = judged("ok", hint="Check the file exists before reading it.", prm_score=-1)
    assert [(x.text, x.source) for x in lessons(hinted, SOURCES)] == [
        ("Check the file exists before reading it.", "hint")
    ]
    # a hint on an answer nobody judged wrong is not a lesson for every later prompt
    fine = judged("ok", hint="Check the file exists before reading it.", prm_score=1)
    assert lessons(fine, SOURCES) == []
    assert lessons(hinted, ["correction", "feedback"]) == []  # a source switched off


def test_side_calls_and_untrained_sessions_teach_nothing() -> None:
    words = "That is too long. Please answer in under 30 words."
    side = judged(words)
    side = side.model_copy(
        update={
            "turn": side.turn.model_copy(
                update={"step": side.turn.step.model_copy(update={"turn_type": "side"})}
            )
        }
    )
    assert lessons(side, SOURCES) == []
    off = judged(words)
    off = off.model_copy(
        update={
            "turn": off.turn.model_copy(
                update={"step": off.turn.step.model_copy(update={"train": False})}
            )
        }
    )
    assert lessons(off, SOURCES) == []


def test_instructions_drop_please_and_questions() -> None:
    assert instructions("Please explain in more detail, 30 words or more. Why is it?") == [
        "Explain in more detail, 30 words or more."
    ]
    assert instructions("Keep it under three lines please.") == ["Keep it under three lines."]
    assert instructions("Could you use pnpm instead?") == []


def test_near_duplicates_are_one_lesson_and_opposites_are_not() -> None:
    assert similarity("Answer in under 30 words.", "Please answer in under 30 words") == 1.0
    assert similarity("Answer in under 30 words.", "Answer in under 40 words.") >= 0.6
    assert (
        similarity("Answer in under 30 words.", "Explain in more detail, 30 words or more.") < 0.6
    )
    assert similarity("", "Answer briefly.") == 0.0


def test_a_lesson_is_one_trimmed_sentence() -> None:
    assert clean("  answer   in\nunder 30 words ") == "Answer in under 30 words."
    long = clean("word " * 200)
    assert len(long) <= 301 and long.endswith("…")


def test_the_block_fits_its_budget_best_first() -> None:
    skills = [Chosen(str(i), f"Lesson number {i} says something useful here.") for i in range(20)]
    chosen = fit(skills, max_tokens=60, max_skills=8)
    assert chosen == skills[: len(chosen)] and 0 < len(chosen) < 8
    assert estimate_tokens(render(chosen)) <= 60
    assert len(fit(skills, max_tokens=4096, max_skills=8)) == 8
    block = render(chosen[:2])
    assert block.startswith(OPEN) and block.endswith(CLOSE)
    assert "- Lesson number 0 says something useful here." in block


def test_the_block_goes_after_the_first_user_words_and_leaves_the_clients_list() -> None:
    messages = [
        {"role": "system", "content": "You are a helper."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"},
    ]
    out = with_block(messages, "B")
    assert out[1]["content"] == "Hi\n\nB" and out[:1] + out[2:] == messages[:1] + messages[2:]
    assert messages[1]["content"] == "Hi"  # the Step keeps the client's
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert with_block(parts, "B")[0]["content"][-1] == {"type": "text", "text": "\n\nB"}


def test_or_at_the_end_of_the_system_prompt() -> None:
    messages = [
        {"role": "system", "content": "You are a helper."},
        {"role": "user", "content": "Hi"},
    ]
    out = with_block(messages, "B", "system")
    assert out[0]["content"] == "You are a helper.\n\nB" and out[1:] == messages[1:]
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be kind."}]}]
    assert with_block(parts, "B", "system")[0]["content"][-1] == {"type": "text", "text": "\n\nB"}
    bare = [{"role": "user", "content": "Hi"}]
    assert with_block(bare, "B", "system") == [{"role": "system", "content": "B"}, *bare]
    # no user words to follow: a system message of its own
    assert with_block([{"role": "system", "content": "S"}], "B")[0] == {
        "role": "system",
        "content": "B",
    }


def test_the_query_is_the_first_user_message() -> None:
    messages = [
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Why is"},
                {"type": "text", "text": "the sky blue?"},
            ],
        },
        {"role": "user", "content": "later"},
    ]
    assert query_of(messages) == "Why is the sky blue?"
    assert query_of([{"role": "system", "content": "S"}]) == ""


def test_whose_skills_a_call_carries() -> None:
    assert user_scope("bob", "h") == "tenant:bob"
    assert user_scope(None, "h") == "key:h"
    assert user_scope(None, None) == ANONYMOUS
    assert scopes_of("tenant:bob") == ["tenant:bob", POLICY]
    bearer = {"authorization": "Bearer claw-sk-1"}
    assert caller(None, "api_key", bearer) == f"key:{hash_key('claw-sk-1')}"
    assert caller("bob", "api_key", bearer) == "tenant:bob"
    # the client key is everyone's: its calls are the anonymous user's
    assert caller(None, "header", bearer) == ANONYMOUS
