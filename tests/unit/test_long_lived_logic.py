"""Long-lived sessions, the pure parts: side calls told apart without headers (on OpenClaw's real
requests), the judge prompt bounded by the judge's context, the verdict after the thinking,
per-turn and episode samples, and turn indexes of closed segments not waited for."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from claw_stream.dialect import flatten_content
from claw_stream.events import ChatMessage, Judgement, SessionEvent, Step, StepResponse, Turn
from claw_stream.ids import derive_uuid7
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.logic.judge_prompts import PRM_SYSTEM, judge_prompt, parse_hint, parse_vote
from claw_stream.worker.logic.samples import episode_drafts, turn_drafts
from claw_stream.worker.logic.turns import (
    classify,
    in_time_order,
    main_line,
    stitch_session,
    stitched_together,
)

from ..support.paths import AGENTS
from ..support.worker import chat, step

FIXTURES = AGENTS / "openclaw"


def _message(m: dict[str, Any]) -> ChatMessage:
    return ChatMessage(
        role=m["role"],
        content=flatten_content(m.get("content")) if m.get("content") is not None else None,
        tool_calls=m.get("tool_calls"),
        tool_call_id=m.get("tool_call_id"),
    )


def _step(body: dict[str, Any], index: int, answer: dict[str, Any]) -> Step:
    base = step("oc", index, [_message(m) for m in body["messages"]], _message(answer))
    request = base.request.model_copy(update={"tools": body.get("tools")})
    return base.model_copy(update={"request": request})


def openclaw_session() -> list[dict[str, Any]]:
    lines = (FIXTURES / "session.jsonl").read_text().splitlines()
    return [json.loads(line)["body"] for line in lines][:3]


def test_openclaw_side_calls_are_side_and_its_turns_main() -> None:
    bodies = openclaw_session()
    # the answer to each call, as OpenClaw echoes it in its next request
    answers = [bodies[1]["messages"][2], bodies[2]["messages"][4], {"role": "assistant"}]
    answers[2] = {"role": "assistant", "content": "Your first question was about IDENTITY.md."}
    history = "\n".join(
        f"{m['role']}: {flatten_content(m.get('content'))}" for m in bodies[0]["messages"][1:]
    )
    compaction = {
        "messages": [
            {"role": "system", "content": "You summarise conversations for later context."},
            {"role": "user", "content": f"Summarise this conversation:\n\n{history}"},
        ]
    }
    title = {
        "messages": [
            {"role": "system", "content": "Write a title of at most six words."},
            bodies[0]["messages"][1],
        ]
    }
    calls = [
        _step(bodies[0], 0, answers[0]),
        _step(compaction, 1, {"role": "assistant", "content": "The user asked about a file."}),
        _step(title, 2, {"role": "assistant", "content": "IDENTITY.md question"}),
        _step(bodies[1], 3, answers[1]),
        _step(bodies[2], 4, answers[2]),
    ]
    placed: list[Step] = []
    why = []
    for call in calls:
        turn_type, reason = classify(call, main_line(placed))
        why.append((turn_type, reason))
        placed.append(call.model_copy(update={"turn_type": turn_type}))
    assert why == [
        ("main", "first"),
        ("side", "other_prompt"),
        ("side", "other_prompt"),
        ("main", "extends"),  # carries the answer of call 0 (its tool call)
        ("main", "extends"),
    ]
    # an engine that answered otherwise than OpenClaw's echo: same prompt and tools, still main
    other = _step(bodies[1], 3, answers[1])
    assert (
        classify(
            other,
            main_line(
                [
                    calls[0].model_copy(
                        update={
                            "response": StepResponse(
                                message=ChatMessage(role="assistant", content="something else"),
                                finish_reason="stop",
                            )
                        }
                    )
                ]
            ),
        )[0]
        == "main"
    )
    # a header wins
    side = calls[3].model_copy(update={"turn_type": "side"})
    assert classify(side, main_line(placed[:1])) == ("side", "header")


def long_turn(n_history: int = 40, next_text: str = "thanks, perfect"):
    replies = [f"question {k}: " + "x" * 200 for k in range(n_history)] + [next_text]
    steps = chat("long", replies)
    turns = stitch_session(steps, closed="session_ended")
    return turns[-2]  # the turn whose next state is `next_text`


def test_the_judge_prompt_fits_and_cuts_the_oldest_history_first() -> None:
    turn = long_turn()
    whole = judge_prompt(PRM_SYSTEM, turn)
    assert whole.history_cut == 0 and whole.chars > 10_000
    bounded = judge_prompt(PRM_SYSTEM, turn, budget_chars=3_000)
    text = bounded.messages[1]["content"]
    assert bounded.chars <= 3_000 and bounded.history_cut > 0
    assert f"[{bounded.history_cut} earlier messages left out]" in text
    assert "question 0:" not in text and "question 38:" in text  # the oldest went first
    assert "[assistant answer] answer 39 of long" in text
    assert "[next state: user] thanks, perfect" in text
    assert "[user] question 39:" in text  # the message the answer replied to


def test_a_huge_next_state_is_clipped_in_the_middle_not_dropped() -> None:
    turn = long_turn(2, "error: " + "trace line\n" * 5000 + "the end")
    prompt = judge_prompt(PRM_SYSTEM, turn, budget_chars=4_000)
    text = prompt.messages[1]["content"]
    assert prompt.chars <= 4_000
    assert "[next state: user] error:" in text and text.rstrip().endswith("the end")
    assert "characters cut" in text


def test_feedback_text_is_evidence_for_the_judge() -> None:
    prompt = judge_prompt(PRM_SYSTEM, long_turn(1), feedback=["too long, be brief"])
    assert "[user feedback on this answer] too long, be brief" in prompt.messages[1]["content"]


def test_the_verdict_comes_after_the_thinking() -> None:
    assert parse_vote("<think>maybe \\boxed{1}? no.</think> So: \\boxed{-1}") == -1
    assert parse_vote("<think>\\boxed{1} looks right, but let me check") is None  # cut off
    assert parse_vote("reasoning \\boxed{0} then \\boxed{1}") == 1
    hint = parse_hint(
        "<think>[HINT_START]draft[HINT_END]</think>\\boxed{1} [HINT_START]Say less.[HINT_END]"
    )
    assert (hint.score, hint.hint) == (1, "Say less.")


def judged(turn: Turn, prm: int | None) -> Judgement:
    return Judgement(
        judgement_id=derive_uuid7(turn.turn_id, "judgement"),
        session_id=turn.session_id,
        turn=turn,
        judge_model="judge",
        prm_score=prm,  # type: ignore[arg-type]
    )


def test_per_turn_samples_and_episode_samples_of_their_own() -> None:
    config = WorkerSettings()
    assert config.release_mode == "per_turn" and config.judge_max_tokens >= 4096
    assert WorkerSettings(precedence=["episode", "prm"]).release_mode == "per_episode"
    steps = chat("ep", ["Step one.", "Go on.", "And then?"])
    turns = stitch_session(steps, closed="session_ended")
    judgements = [judged(t, 1 if k == 0 else 0) for k, t in enumerate(turns)]
    main = [(s.step_id, s.created_at) for s in steps]
    thumbs = SessionEvent(session_id="ep", kind="feedback", score=-1, step_id=steps[1].step_id)
    episode = SessionEvent(session_id="ep", kind="reward", reward=1.0)
    own = turn_drafts(judgements, main, [thumbs, episode], config, "claw.samples")
    # the turn's own signals: PRM, thumbs; never the episode reward
    assert [(d.sample.reward, d.sample.reward_source, d.has_signal) for d in own] == [
        (1.0, "prm", True),
        (-1.0, "feedback", True),
        (0.0, "prm", False),
    ]
    extra = episode_drafts(judgements, [thumbs, episode], config, "claw.samples")
    assert [round(d.sample.reward, 6) for d in extra] == [0.81, 0.9, 1.0]
    assert {d.sample.reward_source for d in extra} == {"episode"}
    assert not {d.sample.sample_id for d in extra} & {d.sample.sample_id for d in own}
    assert episode_drafts(judgements, [thumbs], config, "claw.samples") == []


def test_indexes_of_closed_segments_are_not_waited_for() -> None:
    steps = chat("seg", ["a", "b"])
    later = steps[1].model_copy(update={"turn_index": 5})  # 1-4 went to an earlier segment
    now = later.created_at + timedelta(seconds=1)
    assert stitch_session([steps[0], later], now=now, reorder_grace_s=30) == []
    (turn,) = stitch_session(
        [steps[0], later], now=now, reorder_grace_s=30, settled_through=4, segment=2
    )
    assert turn.closed_reason == "next_step" and turn.segment == 2


def test_a_batch_puts_an_end_fetched_before_its_steps_after_them() -> None:
    """Steps and session events come from two topics, fetched in any order: merged by time,
    each topic's order kept, the session is stitched in one pass with the others."""
    s1, s2, s3, s4 = chat("s-order", ["one", "two", "three", "four"])
    at = s3.created_at
    end = SessionEvent(session_id="s-order", kind="ended", n_steps=3, created_at=at)
    later = s4.model_copy(update={"created_at": at + timedelta(seconds=1)})
    # s2 was made before s1 but sent after it: the steps topic's order stands
    s2 = s2.model_copy(update={"created_at": s1.created_at - timedelta(seconds=1)})
    fetched = [end, s1, s2, s3, later]
    assert not stitched_together(fetched, closed=False)  # steps after an end: one by one
    ordered = in_time_order(fetched)
    assert ordered == [s1, s2, s3, end, later]  # a tie: the step first
    assert not stitched_together(ordered, closed=False)  # a step made after the end still is
    assert stitched_together(in_time_order([end, s1, s2, s3]), closed=False)
    assert in_time_order([s3, s1]) == [s3, s1]  # steps alone: as fetched
