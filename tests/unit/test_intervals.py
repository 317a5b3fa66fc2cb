"""The intervals a held-out curve is read with: a share's and a paired win rate's."""

from __future__ import annotations

import pytest

from claw_stream.evaluation.intervals import wilson, win_rate


def test_wilson_matches_the_published_interval() -> None:
    # Newcombe (1998), table I: 15 of 148 -> 0.0624 to 0.1605; 0 of 20 -> 0 to 0.1611
    share = wilson(15, 148)
    assert share.low == pytest.approx(0.0624, abs=5e-4)
    assert share.high == pytest.approx(0.1605, abs=5e-4)
    none = wilson(0, 20)
    assert none.low == 0.0 and none.high == pytest.approx(0.1611, abs=5e-4)
    every = wilson(20, 20)  # not an empty interval at n of n, unlike the normal approximation
    assert every.high == 1.0 and every.low == pytest.approx(1 - 0.1611, abs=5e-4)


def test_a_small_difference_on_24_questions_is_within_the_noise() -> None:
    # 10 of 24 against 14 of 24: the intervals overlap widely
    assert wilson(10, 24).high > wilson(14, 24).low


def test_win_rate_counts_wins_ties_and_losses_on_the_same_prompts() -> None:
    new = [1, 1, 1, 0, 0, 1]
    base = [0, 1, 0, 1, 0, 0]
    w = win_rate(new, base)
    assert (w.wins, w.ties, w.losses) == (3, 2, 1)
    assert w.value == pytest.approx((3 + 1) / 6)
    assert w.low <= w.value <= w.high


def test_a_version_beats_another_only_beyond_the_interval() -> None:
    # better on 18 of 24 questions, tied on the rest: clearly better
    clear = win_rate([1.0] * 24, [0.0] * 18 + [1.0] * 6)
    assert clear.value == pytest.approx(0.875) and clear.low > 0.5 and clear.beats
    # better on 3, worse on 1, tied on 20: a point above one half, not beyond the interval
    unsure = win_rate([1.0] * 3 + [0.0] + [1.0] * 20, [0.0] * 3 + [1.0] + [1.0] * 20)
    assert unsure.value > 0.5 and not unsure.beats
    # the same answers: exactly one half
    same = win_rate([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert same.value == 0.5 and not same.beats


def test_winning_every_prompt_is_not_certainty() -> None:
    # 24 of 24 won: the interval still says what 24 questions can show (a bootstrap said 100%)
    every = win_rate([1.0] * 24, [0.0] * 24)
    assert every.value == 1.0 and every.high == pytest.approx(1.0)
    assert every.low == pytest.approx(wilson(24, 24).low) and every.low < 0.9


def test_scores_of_different_prompt_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="not the same prompts"):
        win_rate([1.0, 0.0], [1.0])
