"""Why a turn gave no sample, in the words `claw-stream doctor` prints."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from claw_stream.store.turn_report import TurnFacts, summarise, why

SAMPLED = TurnFacts(
    session_id="s",
    step_id=uuid.uuid4(),
    turn_index=0,
    turn_type="main",
    step_train=True,
    masked=False,
    session_train=True,
    placed=True,
    stitched=True,
    has_next_state=True,
    token_drift=None,
    judged=True,
    judge_skipped=False,
    retry_attempts=None,
    retry_error=None,
    retry_next_at=None,
    gave_up=False,
    status="published",
    reward=1.0,
    reward_source="reaction",
    trained_in_step=None,
)


def facts(**changes: object) -> TurnFacts:
    return dataclasses.replace(SAMPLED, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({}, "sampled (reward +1, reaction): waiting for the trainer"),
        ({"trained_in_step": 3}, "trained in step 3"),
        ({"turn_type": "side", "status": None}, "side call"),
        ({"masked": True, "step_train": False, "status": None}, "redacted"),
        ({"step_train": False, "status": None}, "X-Claw-Train: false"),
        ({"session_train": False, "status": None, "judged": True}, "session switched off"),
        ({"placed": False, "stitched": False, "judged": False, "status": None}, "not placed"),
        ({"stitched": False, "judged": False, "status": None}, "no next state yet"),
        (
            {"judged": False, "status": None, "has_next_state": False},
            "no next state yet",
        ),
        (
            {
                "judged": False,
                "status": None,
                "retry_attempts": 2,
                "retry_error": "TimeoutError",
                "retry_next_at": datetime(2026, 11, 27, 12, 0, 5, tzinfo=UTC),
            },
            "judge busy: asked again at 12:00:05 (attempt 2): TimeoutError",
        ),
        (
            {"status": None, "retry_attempts": 9, "retry_error": "TimeoutError", "gave_up": True},
            "judge error: gave up after 9 attempts",
        ),
        ({"status": "no_signal", "reward": 0.0}, "no signal"),
        (
            {"status": None, "judge_skipped": True, "token_drift": "token_drift: at 7 of 9"},
            "token_drift: at 7 of 9 (worker.token_drift: drop",
        ),
        (
            {"trained_in_step": 2, "token_drift": "token_drift: at 7"},
            "step 2 (reward +1, reaction); token_drift",
        ),
        ({"status": "dropped"}, "stale"),
        ({"status": "held"}, "held while new weights"),
    ],
)
def test_each_turn_says_what_became_of_it(changes: dict[str, object], said: str) -> None:
    assert said in why(facts(**changes))


def test_a_trained_turn_of_a_session_switched_off_later_still_says_it_trained() -> None:
    assert why(facts(session_train=False, trained_in_step=1)).startswith("trained in step 1")


def test_sessions_count_main_turns_judged_sampled_and_trained() -> None:
    turns = [
        facts(),
        facts(turn_index=1, trained_in_step=2),
        facts(turn_index=2, status="no_signal"),
        facts(turn_index=3, judged=False, status=None),
        facts(turn_index=4, turn_type="side", status=None),
    ]
    (s,) = summarise(turns)
    assert (s.main, s.side, s.judged, s.sampled, s.trained) == (4, 1, 3, 2, 1)


def test_the_doctors_openclaw_requests_are_the_recorded_ones() -> None:
    import json

    from claw_stream.agents.doctor import agent_requests, context_to_hold

    from ..support.paths import AGENTS

    first = AGENTS / "openclaw"
    shipped = agent_requests()
    full = json.loads((first / "session.jsonl").read_text().splitlines()[0])["body"]
    small = json.loads((first / "small-profile.jsonl").read_text().splitlines()[0])["body"]
    assert shipped["full"] == full and shipped["small"] == small
    assert len(shipped["full"]["tools"]) == 12
    assert context_to_hold(12_743) == 16_384
