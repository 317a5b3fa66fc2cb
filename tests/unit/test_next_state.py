"""One next-state rule (`claw_stream.next_state`): the worker's judge, the held-out replay and
the console read the same next state for every turn of OpenClaw's recorded conversation, its
compaction included. The replay and the console once took the messages past the prompt's
length, and after a rewritten history only the next call's last user message, where the judge
took what follows the last assistant message."""

from __future__ import annotations

import json
from typing import Any

from claw_stream.console.reading import shown_next_state
from claw_stream.evaluation.replay.records import next_state as replay_next_state
from claw_stream.events import ChatMessage, Step, StepRequest, Turn
from claw_stream.gateway.capture import step_request
from claw_stream.worker.logic.judge_prompts import PRM_SYSTEM, judge_prompt
from claw_stream.worker.logic.turns import stitch_session

from ..support.paths import AGENTS
from ..support.worker import step

SESSION = "openclaw-s1"


def recorded() -> list[dict[str, Any]]:
    lines = (AGENTS / "openclaw" / "small-profile-session.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def steps_of(records: list[dict[str, Any]]) -> list[Step]:
    """The Steps the gateway archives for the recorded calls (the stub's answers as answers):
    the calls with tools are the conversation's, the summary calls side turns."""
    out = []
    for index, record in enumerate(records):
        request = StepRequest.model_validate(step_request(record["body"]), strict=False)
        answer = ChatMessage(role="assistant", content=record["answer"])
        kind = "main" if record["body"].get("tools") else "side"
        out.append(step(SESSION, index, request.messages, answer, turn_type=kind))
    return out


def judged(turn: Turn) -> list[ChatMessage]:
    """The worker's next state, as its judge reads it (checked to be in the judge's prompt)."""
    prompt = judge_prompt(PRM_SYSTEM, turn).messages[-1]["content"]
    for message in turn.next_state or []:
        assert f"[next state: {message.role}] {message.content}" in prompt
    return turn.next_state or []


def read_everywhere(steps: list[Step]) -> dict[int, tuple[list[ChatMessage], str | None, Any]]:
    """By turn index: the worker's next state, the replay's and the console's, each read the
    way its own code reads it (the replay and the console from the archived payloads)."""
    by_id = {s.step_id: s for s in steps}
    out = {}
    for turn in stitch_session(steps, closed="session_ended"):
        payload = turn.step.model_dump(mode="json")
        following = by_id[turn.next_step_id] if turn.next_step_id else None
        after = following.model_dump(mode="json") if following else None
        out[turn.step.turn_index] = (
            judged(turn),
            replay_next_state(payload, after),
            shown_next_state(payload, after),
        )
    return out


def assert_one_rule(seen: dict[int, tuple[list[ChatMessage], str | None, Any]]) -> None:
    for index, (worker, replay, console) in seen.items():
        text = "\n".join(f"[{m.role}] {m.content}" for m in worker) or None
        assert replay == text, index
        assert console == [m.model_dump(mode="json") for m in worker], index


def test_the_judge_the_replay_and_the_console_read_one_next_state_of_openclaw() -> None:
    records = recorded()
    steps = steps_of(records)
    main = [s.turn_index for s in steps if s.turn_type == "main"]
    assert main == [0, 1, 2, 3, 4, 13]  # the compaction's eight summary calls between 4 and 13
    compacted = steps[13].request.messages
    assert len(compacted) < len(steps[4].request.messages)
    assert "compacted" in (compacted[1].content or "")

    seen = read_everywhere(steps)
    assert sorted(seen) == main
    assert_one_rule(seen)
    # around the compaction: turn 3's next words, turn 4's (before the compaction, read from
    # the compacted request, which kept turn 4's answer), and none after the last turn
    assert "Thanks. One more" in (seen[3][0][0].content or "")
    before = seen[4][0]
    assert [m.content for m in before] == [compacted[-1].content]
    assert "Which river runs through Canberra?" in (before[0].content or "")
    assert seen[13] == ([], None, [])


def test_a_compaction_that_kept_no_turn_is_read_alike() -> None:
    """The same compaction with nothing of the conversation kept verbatim: turn 4's answer is
    gone from the next request, and what follows the last assistant message (none: the summary
    and the user's new words) is the next state for all three. The old reading of the replay
    and the console kept only the last user message."""
    steps = steps_of(recorded())
    resumed = steps[13]
    system, summary, *_, said = resumed.request.messages
    bare = resumed.request.model_copy(update={"messages": [system, summary, said]})
    steps[13] = resumed.model_copy(update={"request": bare})

    seen = read_everywhere(steps)
    assert_one_rule(seen)
    assert seen[4][0] == [summary, said]
    assert seen[4][1] == f"[user] {summary.content}\n[user] {said.content}"
