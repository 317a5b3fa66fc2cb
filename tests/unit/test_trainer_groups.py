"""The trainer holds a GRPO group until it is whole (or timed out), and never commits past it."""

from __future__ import annotations

from claw_stream.events import Sample
from claw_stream.ids import uuid7
from claw_stream.trainer.groups import GroupGate
from claw_stream.trainer.policy import n_groups


def sample(session: str, group: str | None, reward: float = 1.0) -> Sample:
    return Sample(
        sample_id=uuid7(),
        session_id=session,
        group_id=group,
        step_id=uuid7(),
        turn_id=uuid7(),
        method="binary",
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        reward=reward,
        reward_source="episode",
        weight_version=0,
        released_at_version=0,
    )


def test_a_group_waits_for_its_last_session_then_leaves_whole() -> None:
    gate = GroupGate(size=2, timeout_s=60, settle_s=1)
    first = sample("t1-0", "t1")
    gate.add(first, "s:0", 10, now=0.0)
    alone = sample("live", None)
    gate.add(alone, "s:1", 4, now=0.0)
    assert gate.release(0.5) == [alone]  # no group: at once
    assert gate.release(30.0) == [] and gate.held == 1
    assert gate.safe_offsets({"s:0": 12, "s:1": 5}) == {"s:0": 10, "s:1": 5}
    second = sample("t1-1", "t1")
    gate.add(second, "s:0", 11, now=31.0)
    gate.add(second, "s:0", 11, now=31.0)  # redelivered: once
    assert gate.next_due(31.0) == 1.0
    assert gate.release(31.5) == []  # settling: a session may send several samples
    assert gate.release(32.0) == [first, second]
    assert gate.held == 0 and gate.safe_offsets({"s:0": 12}) == {"s:0": 12}
    assert n_groups([first, second, alone]) == 1


def test_an_incomplete_group_trains_after_its_timeout() -> None:
    gate = GroupGate(size=4, timeout_s=10)
    members = [sample(f"t2-{k}", "t2") for k in range(2)]
    for k, member in enumerate(members):
        gate.add(member, "s:0", k, now=float(k))
    assert gate.next_due(1.0) == 9.0
    assert gate.release(9.9) == []
    assert gate.release(10.0) == members


def test_without_a_group_size_nothing_waits() -> None:
    gate = GroupGate(size=None, timeout_s=10)
    member = sample("t3-0", "t3")
    gate.add(member, "s:0", 0, now=0.0)
    assert gate.release(0.0) == [member] and gate.next_due(0.0) is None


def test_a_group_whose_rewards_are_all_equal_is_set_aside_not_trained() -> None:
    gate = GroupGate(size=3, timeout_s=60, settle_s=1, skip_flat=True)
    failed = [sample(f"f-{k}", "f", reward=-1.0) for k in range(3)]  # every attempt failed
    mixed = [sample(f"m-{k}", "m", reward=r) for k, r in enumerate((-1.0, 1.0, -1.0))]
    for k, member in enumerate(failed + mixed):
        gate.add(member, "s:0", k, now=0.0)
    assert gate.release(2.0) == mixed  # only the group with signal trains
    assert gate.take_flat() == [failed] and gate.take_flat() == []
    assert gate.held == 0  # set aside is released too: the offsets go past it
    # a lone sample of a timed-out group keeps its reward (no normalisation): it trains
    lone = sample("l-0", "l", reward=1.0)
    gate.add(lone, "s:0", 9, now=0.0)
    assert gate.release(60.0) == [lone] and gate.take_flat() == []


def test_without_skip_flat_an_all_equal_group_trains_as_before() -> None:
    gate = GroupGate(size=2, timeout_s=60, settle_s=1)
    same = [sample(f"e-{k}", "e", reward=1.0) for k in range(2)]
    for k, member in enumerate(same):
        gate.add(member, "s:0", k, now=0.0)
    assert gate.release(2.0) == same and gate.take_flat() == []
