"""The `reaction` reward source: the user's next words as a reward, on labelled next states
(bench/data/, written for it: approvals, corrections, neutral follow-ups, tool results)."""

from __future__ import annotations

import asyncio
import json

import pytest

from claw_stream.events import ChatMessage
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.logic.rewards import Signals, step_reward
from claw_stream.worker.reaction import reaction, user_words
from claw_stream.worker.reward_sources import load_sources, score_all

from ..support.factories import make_turn
from ..support.paths import REPO

DATA = REPO / "bench" / "data"


def labelled(name: str) -> list[tuple[list[ChatMessage], int, str]]:
    rows = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]
    return [([ChatMessage(**m) for m in r["next"]], r["label"], r["kind"]) for r in rows]


def sign(next_state: list[ChatMessage]) -> int:
    found = reaction(user_words(next_state))
    return 0 if found is None else (1 if found.score > 0 else -1)


@pytest.mark.parametrize("name", ["reactions", "reactions-heldout"])
def test_it_never_reads_an_approval_as_a_correction_nor_the_reverse(name: str) -> None:
    rows = labelled(name)
    wrong = [(m[0].content, label) for m, label, _ in rows if sign(m) * label < 0]
    assert wrong == []
    # what judges nothing is left to the PRM: follow-up requests, questions, tool results
    spoke = [(m[0].content, kind) for m, label, kind in rows if label == 0 and sign(m) != 0]
    assert spoke == []


def test_the_set_its_cues_were_written_with_agrees_whole() -> None:
    rows = labelled("reactions")
    assert [(m[0].content, label) for m, label, _ in rows if sign(m) != label] == []


def test_the_words_are_the_users_own() -> None:
    wrapped = ChatMessage(
        role="user",
        content="<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nActive exec sessions: none\n"
        "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
    )
    said = ChatMessage(role="user", content="<system-reminder>be kind</system-reminder>No.")
    assert user_words([wrapped, said]) == "No."
    assert user_words([ChatMessage(role="tool", tool_call_id="c", content="thanks")]) == ""
    assert user_words(None) == ""


def test_thanks_trains_up_and_a_correction_down_ahead_of_a_silent_prm() -> None:
    """As the worker combines them: `reaction` before `prm` in the precedence, the PRM's 0
    (SmolLM2 voted 0, 0, 0 on these) decides only where the user's words judge nothing."""
    config = WorkerSettings(rewards=[{"use": "reaction"}, {"use": "prm"}])
    assert config.precedence == ["explicit", "feedback", "episode", "reaction", "prm"]
    (source,) = load_sources(config)
    rewards = {}
    for said in ("Thanks, that is right.", "No, that's wrong.", "Now the next file."):
        turn = make_turn().model_copy(
            update={"next_state": [ChatMessage(role="user", content=said)]}
        )
        scores = asyncio.run(score_all([source], turn, {}))
        signals = Signals(
            prm=0.0, sources={s.source: s.score for s in scores if s.score is not None}
        )
        rewards[said] = step_reward(signals, config.precedence)
    assert rewards == {
        "Thanks, that is right.": (1.0, "reaction"),
        "No, that's wrong.": (-1.0, "reaction"),
        "Now the next file.": (0.0, "prm"),
    }
