"""A turn's prompt ids must continue the previous turn's prompt and answer ids where its
messages continue them (the gateway's own records, never a re-tokenisation)."""

from __future__ import annotations

import itertools

from claw_stream.events import ChatMessage
from claw_stream.worker.logic.turns import drifts_of, token_drift, turn_id_of

from ..support.worker import chat


def test_a_conversation_whose_ids_continue_has_no_drift() -> None:
    steps = chat("s", ["Name a colour.", "Thanks!", "And another?"])
    assert [token_drift(a, b) for a, b in itertools.pairwise(steps)] == [None, None]
    assert drifts_of(steps, settled=set()) == {}


def test_an_answer_rendered_otherwise_than_sampled_is_drift() -> None:
    first, second = chat("s", ["Name a colour.", "Thanks!"])
    # the template rendered the earlier answer with one token split otherwise
    ids = list(second.prompt_token_ids)
    at = len(first.prompt_token_ids) + 1
    ids[at] += 1
    drifted = second.model_copy(update={"prompt_token_ids": ids})
    said = token_drift(first, drifted)
    assert said is not None and said.startswith("token_drift:")
    assert f"at {at} of " in said and "in the answer" in said
    assert drifts_of([first, drifted], settled=set()) == {drifted.step_id: said}
    # once its turn was emitted, its drift is not looked for again
    assert drifts_of([first, drifted], settled={turn_id_of(drifted)}) == {}


def test_a_rewritten_history_or_a_masked_prompt_is_not_checked() -> None:
    first, second = chat("s", ["Name a colour.", "Thanks!"])
    wrong = list(second.prompt_token_ids)
    wrong[1] += 1
    compacted = second.model_copy(
        update={
            "prompt_token_ids": wrong,
            "request": second.request.model_copy(
                update={"messages": [ChatMessage(role="user", content="Summary. Thanks!")]}
            ),
        }
    )
    assert token_drift(first, compacted) is None  # the conversation says nothing of its ids
    masked = second.model_copy(update={"prompt_token_ids": [], "train": False})
    assert token_drift(first, masked) is None
