"""The pure logic the stream processors apply: next states, judge answers, rewards."""

from __future__ import annotations

import pytest

from claw_stream.events import ChatMessage, FunctionCall, Step, StepResponse, ToolCall
from claw_stream.ids import derive_uuid7
from claw_stream.next_state import NextState, next_state
from claw_stream.worker.logic.judge_prompts import (
    VOTE_STOPS,
    HintVote,
    choose_hint,
    majority,
    parse_hint,
    parse_vote,
    prm_messages,
    shows_thinking,
    teacher_messages,
    with_stop,
)
from claw_stream.worker.logic.rewards import Signals, discounted, has_signal, is_stale, step_reward

from ..support.factories import make_step, make_turn
from ..support.worker import chat


def with_messages(step, messages, answer=None):
    request = step.request.model_copy(update={"messages": messages})
    update = {"request": request}
    if answer is not None:
        update["response"] = StepResponse(message=answer, finish_reason="stop")
    return step.model_copy(update=update)


def state_after(step: Step, following: Step) -> NextState | None:
    return next_state(step.response.message, following.request.messages)


USER = ChatMessage(role="user", content="List the files.")
ANSWER = ChatMessage(role="assistant", content="Here they are: a.txt")


def test_user_reply_is_the_next_state() -> None:
    first = with_messages(make_step(), [USER], ANSWER)
    reply = ChatMessage(role="user", content="No, include hidden files.")
    second = with_messages(make_step(turn_index=1), [USER, ANSWER, reply])
    state = state_after(first, second)
    assert state is not None and state.exact and state.messages == [reply]


def test_tool_result_is_the_next_state_matched_by_call_id() -> None:
    call = ToolCall(id="call_7", function=FunctionCall(name="ls", arguments="{}"))
    answer = ChatMessage(role="assistant", content=None, tool_calls=[call])
    first = with_messages(make_step(), [USER], answer)
    echoed = ChatMessage(
        role="assistant", content="", tool_calls=[call]
    )  # agents re-send it edited
    result = ChatMessage(role="tool", tool_call_id="call_7", content="a.txt b.txt")
    state = state_after(first, with_messages(make_step(turn_index=1), [USER, echoed, result]))
    assert state is not None and state.messages == [result]


def test_rewritten_history_falls_back_to_what_follows_the_last_answer() -> None:
    first = with_messages(make_step(), [USER], ANSWER)
    other = ChatMessage(role="assistant", content="(summary of earlier turns)")
    retry = ChatMessage(
        role="user", content="[Queued user message from a previous active turn] thanks"
    )
    state = state_after(first, with_messages(make_step(turn_index=1), [other, retry]))
    assert state is not None and not state.exact and state.messages == [retry]


def test_nothing_added_means_no_next_state() -> None:
    first = with_messages(make_step(), [USER], ANSWER)
    assert state_after(first, with_messages(make_step(turn_index=1), [USER, ANSWER])) is None


@pytest.mark.parametrize(
    ("text", "vote"),
    [
        ("The user thanked it. \\boxed{1}", 1),
        ("\\boxed{ -1 }", -1),
        ("first \\boxed{1} then, on reflection, \\boxed{0}", 0),
        ("\\boxed{2}", None),
        ("no box at all", None),
    ],
)
def test_vote_parsing(text: str, vote: int | None) -> None:
    assert parse_vote(text) == vote


def _choice(content: str, reasoning: str = "", finish: str = "stop", met: str | None = None):
    message = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    return {"message": message, "finish_reason": finish, "stop_reason": met}


@pytest.mark.parametrize(
    ("choice", "thinks", "answer"),
    [
        (_choice("A correction. ", met="\\boxed{-1}"), False, "A correction. \\boxed{-1}"),
        (_choice("Unclear.", finish="length"), False, "Unclear."),
        (_choice("<think>Hmm. ", met="\\boxed{0}"), True, None),  # a draft box
        (
            _choice("<think>Hmm.</think> No. ", met="\\boxed{-1}"),
            True,
            "<think>Hmm.</think> No. \\boxed{-1}",
        ),
        # behind vLLM's reasoning parser: a box met in the thinking leaves the content empty
        (_choice("", reasoning="At first sight ", met="\\boxed{0}"), True, None),
        (_choice("No. ", reasoning="Let me see.", met="\\boxed{-1}"), True, "No. \\boxed{-1}"),
        (_choice("", reasoning="Let me see", finish="length"), True, ""),
    ],
)
def test_a_vote_stopped_at_its_box_and_whether_the_judge_thinks(choice, thinks, answer) -> None:
    assert shows_thinking(choice) is thinks
    assert with_stop(choice, VOTE_STOPS) == answer


@pytest.mark.parametrize(
    ("votes", "score"),
    [
        ([1, 1, -1], 1),
        ([-1, -1, 0], -1),
        ([1, -1, 0], 0),
        ([1, -1], 0),
        ([None, None], 0),
        ([None, -1], -1),
    ],
)
def test_majority_with_ties_and_nothing_parseable_as_zero(votes, score) -> None:
    assert majority(votes) == score


def test_longest_accepted_hint_over_ten_characters() -> None:
    votes = [
        parse_hint("\\boxed{1} [HINT_START]Be brief.[HINT_END]"),  # 9 characters: too short
        parse_hint("\\boxed{1} [HINT_START]Answer in under thirty words.[HINT_END]"),
        parse_hint(
            "\\boxed{-1} [HINT_START]A much longer hint that was not accepted at all.[HINT_END]"
        ),
        HintVote(score=1, hint="List hidden files too.", raw=""),
    ]
    assert choose_hint(votes) == "Answer in under thirty words."
    assert choose_hint([parse_hint("\\boxed{-1}")]) is None


def test_judge_and_teacher_prompts() -> None:
    turn = make_turn()
    prompt = prm_messages(turn)[1]["content"]
    assert "[next state: tool] a.txt b.txt" in prompt and "ls({})" in prompt
    teacher = teacher_messages(turn, "Use ls -la.")
    assert teacher[-1].role == "user" and teacher[-1].content.endswith("[Hint] Use ls -la.")
    assert turn.step.request.messages[-1].content == "List the files."  # the original is untouched


def test_reward_precedence_discount_signal_and_staleness() -> None:
    assert step_reward(Signals(explicit=0.5, feedback=-1, prm=1)) == (0.5, "explicit")
    assert step_reward(Signals(feedback=-1, prm=1)) == (-1.0, "feedback")
    assert step_reward(Signals(prm=1)) == (1.0, "prm")
    assert step_reward(Signals(feedback=1, prm=-1), ("prm", "feedback")) == (-1.0, "prm")
    assert step_reward(Signals()) == (0.0, "none")
    assert discounted(1.0, 3, 0.5) == [0.25, 0.5, 1.0]
    assert not has_signal("binary", 0.0, True) and has_signal("binary", -1.0, False)
    assert has_signal("opd", 0.0, True) and not has_signal("opd", 1.0, False)
    assert has_signal("combine", 0.0, True) and not has_signal("combine", 0.0, False)
    assert is_stale(1, 4, 2) and not is_stale(2, 4, 2)


def _line(session: str, replies: list[str]):
    return chat(session, replies)


def test_a_sessions_turns_wait_for_a_missing_index_then_take_it_as_lost() -> None:
    from datetime import timedelta

    from claw_stream.worker.logic.turns import stitch_session

    steps = _line("s-gap", ["One.", "Two.", "Three."])
    with_gap = [steps[0], steps[2].model_copy(update={"turn_index": 3})]  # index 1, 2 missing
    now = steps[2].created_at
    assert stitch_session(with_gap, now=now, reorder_grace_s=30) == []
    later = now + timedelta(seconds=31)
    (turn,) = stitch_session(with_gap, now=later, reorder_grace_s=30)
    assert turn.step.step_id == steps[0].step_id and turn.next_step_id == with_gap[1].step_id
    closed = stitch_session(with_gap, closed="done", now=now)
    assert [t.closed_reason for t in closed] == ["next_step", "done"] and closed[-1].is_last


def test_a_step_that_adds_nothing_supersedes_the_one_before() -> None:
    from claw_stream.worker.logic.turns import stitch_session

    first = with_messages(make_step(turn_index=0), [USER], ANSWER)
    retry = with_messages(make_step(turn_index=1), [USER, ANSWER])  # nothing after the answer
    turns = stitch_session([first, retry, first], closed="session_ended")
    assert [t.closed_reason for t in turns] == ["superseded", "session_ended"]
    assert turns[0].next_state is None


def test_assembly_join_rule_episode_discount_and_one_sample_per_session() -> None:
    from claw_stream.events import Judgement, SessionEvent
    from claw_stream.worker.config import WorkerSettings
    from claw_stream.worker.logic.samples import assemble_session
    from claw_stream.worker.logic.turns import stitch_session

    steps = _line("s-asm", ["Q1", "Q2", "Q3"])
    turns = stitch_session(steps, closed="session_ended")
    judgements = [
        Judgement(
            judgement_id=derive_uuid7(t.turn_id, "judgement"),
            session_id=t.session_id,
            turn=t,
            judge_model="m",
            prm_votes=[score] if score is not None else [],
            prm_raw=["x"] if score is not None else [],
            prm_score=score,
        )
        for t, score in zip(turns, [1, -1, None], strict=True)
    ]
    reward = SessionEvent(session_id="s-asm", kind="reward", reward=1.0)
    join = WorkerSettings(reward_rule="join", precedence=["episode", "prm"], gamma=0.5)
    drafts = assemble_session(judgements, [reward], join, "t")
    assert [d.sample.reward for d in drafts] == [(0.25 + 1) / 2, (0.5 - 1) / 2, 1.0]
    assert [d.sample.reward_source for d in drafts] == ["episode"] * 3
    nothing = assemble_session(judgements, [], WorkerSettings(precedence=["explicit"]), "t")
    assert [d.has_signal for d in nothing] == [False, False, True]  # the session's one sample
    ids = {d.sample.sample_id for d in drafts} | {d.sample.sample_id for d in nothing}
    assert len(ids) == 3  # ids derive from the judgement and method, not the reward rule
