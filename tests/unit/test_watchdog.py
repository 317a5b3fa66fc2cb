"""The rollback watchdog's decision (pure): the last K versions each lost to the best recent one
on the held-out items, or nothing is done."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from claw_stream.events import WeightEvent
from claw_stream.versions.config import WatchdogSettings
from claw_stream.versions.watchdog import Watchdog

ITEMS = [f"t{i}" for i in range(4)]


def passes(k: int) -> dict[str, float]:
    """The first k of the four items passed."""
    return {item: float(i < k) for i, item in enumerate(ITEMS)}


def dog(patience: int = 2, window: int = 4, margin: float = 0.1) -> Watchdog:
    return Watchdog(WatchdogSettings(enabled=True, patience=patience, window=window, margin=margin))


def test_too_few_versions_to_judge() -> None:
    finding = dog().check({0: passes(3), 1: passes(0)})
    assert finding.rollback_to is None and "fewer than 2 + 1" in finding.reason


def test_k_consecutive_losses_roll_back_to_the_best_recent_version() -> None:
    finding = dog().check({0: passes(3), 1: passes(4), 2: passes(0), 3: passes(1)})
    assert finding.rollback_to == 1  # the best of the versions before the last two
    assert "against v1 below 40% for 2 consecutive versions" in finding.reason
    assert "v2 0% [" in finding.reason and "v3 12% [" in finding.reason


def test_one_version_that_holds_its_own_is_enough_to_wait() -> None:
    # v3 ties v1 on every item: 50%, not a loss
    finding = dog().check({0: passes(3), 1: passes(4), 2: passes(0), 3: passes(4)})
    assert finding.rollback_to is None and "rolls back below 40%" in finding.reason


def test_the_margin_and_the_window() -> None:
    scores = {0: passes(4), 1: passes(2), 2: passes(2), 3: passes(1)}
    # v3 against v2 (the best in a window of 1): three ties, one loss: 37.5%
    assert dog(patience=1, window=1).check(scores).rollback_to == 2
    assert dog(patience=1, window=1, margin=0.2).check(scores).rollback_to is None  # 30%
    # a window of 3 reaches v0, which passed all four: v3 lost 3, tied 1 against it
    assert dog(patience=1, window=3).check(scores).rollback_to == 0


def test_versions_left_behind_by_a_rollback_no_longer_count() -> None:
    watchdog = dog()
    scores = {0: passes(3), 1: passes(4), 2: passes(0), 3: passes(1)}
    assert watchdog.check(scores).rollback_to == 1
    watchdog.rolled_back(1, 3)
    # v4, trained on from v1, did badly once: v1 against v0 was a win, so no second rollback
    scores[4] = passes(0)
    assert watchdog.check(scores).rollback_to is None
    scores[5] = passes(0)  # and once more: v4 and v5 both lost to v1
    assert watchdog.check(scores).rollback_to == 1


def test_a_reason_goes_on_a_rollback_only() -> None:
    event = WeightEvent(policy="p", version=1, status="ready", rolled_back_from=3, reason="why")
    assert event.reason == "why"
    with pytest.raises(ValidationError, match="rollback"):
        WeightEvent(policy="p", version=4, status="ready", reason="why")
