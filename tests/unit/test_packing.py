"""Which samples share a forward pass: a session's turns whose prompts extend one another."""

from __future__ import annotations

from claw_stream.events import Sample
from claw_stream.ids import uuid7
from claw_stream.trainer.batching import collate, pack_samples


def sample(session: str, prompt: list[int], response: list[int]) -> Sample:
    return Sample(
        sample_id=uuid7(),
        session_id=session,
        step_id=uuid7(),
        turn_id=uuid7(),
        method="binary",
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-1.0] * len(response),
        reward=1.0,
        reward_source="prm",
        weight_version=0,
        released_at_version=0,
    )


def test_append_only_turns_share_one_row_in_any_order() -> None:
    first = sample("a", [1, 2, 3], [4, 5])
    second = sample("a", [1, 2, 3, 4, 5, 6], [7])
    third = sample("a", [1, 2, 3, 4, 5, 6, 7, 8], [9, 10])
    other = sample("b", [1, 2, 3], [4, 5])  # the same tokens in another session: its own row
    packs, unpacked = pack_samples([third, other, first, second])
    assert unpacked == 0
    assert [[s.session_id for s in p.members] for p in packs] == [["a", "a", "a"], ["b"]]
    assert packs[0].ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    batch = collate(packs, pad_id=0)
    assert batch.input_ids.shape == (2, 10) and batch.n_trained == 7
    assert batch.rows is not None and batch.rows.tolist() == [0, 0, 0, 1]


def test_a_rewritten_history_or_a_side_call_starts_a_row_of_its_own_and_is_counted() -> None:
    main = sample("a", [1, 2, 3], [4])
    compacted = sample("a", [1, 9, 4, 5], [6])  # the history was summarised
    later = sample("a", [1, 9, 4, 5, 6, 7], [8])  # extends the compacted line
    packs, unpacked = pack_samples([main, compacted, later])
    assert unpacked == 1
    assert sorted(len(p.members) for p in packs) == [1, 2]


def test_a_row_never_grows_past_the_limit_and_no_answer_is_cut() -> None:
    prompt: list[int] = [1, 2, 3]
    turns = []
    for k in range(4):
        response = [50 + k, 60 + k]
        turns.append(sample("a", prompt, response))
        prompt = prompt + response + [70 + k]
    packs, unpacked = pack_samples(turns, max_tokens=10)
    assert all(len(p.ids) <= 10 for p in packs if len(p.members) > 1)
    assert sum(len(p.members) for p in packs) == 4 and unpacked == len(packs) - 1
    for pack in packs:  # every member's answer lies whole inside its row
        for s in pack.members:
            full = s.prompt_token_ids + s.response_token_ids
            assert pack.ids[: len(full)] == full


def test_packing_off_gives_one_row_per_sample() -> None:
    first = sample("a", [1, 2], [3])
    second = sample("a", [1, 2, 3, 4], [5])
    packs, unpacked = pack_samples([first, second], enabled=False)
    assert [len(p.members) for p in packs] == [1, 1] and unpacked == 0
