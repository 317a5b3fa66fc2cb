"""Gated serving's decisions: promotion with a margin, where a gated trainer goes on from, which
checkpoints pruning keeps, version numbers, staleness after a rollback and the contract."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from claw_stream.embedded.supervisor import Supervisor
from claw_stream.events import WeightEvent
from claw_stream.settings import load_settings
from claw_stream.versions.checkpoints import prunable
from claw_stream.versions.following import reset_target
from claw_stream.versions.numbering import next_version
from claw_stream.versions.promotion import judge
from claw_stream.versions.push import candidate_engines
from claw_stream.versions.serving_view import ServingView
from claw_stream.worker.logic.rewards import is_stale


def test_a_candidate_is_promoted_within_the_margin_and_rejected_beyond_it() -> None:
    assert judge(0.8, 0.8, 0.0, (3, 2)).promote
    assert judge(0.9, 0.8, 0.0, (3, 2)).promote
    assert not judge(0.7, 0.8, 0.0, (3, 2)).promote
    assert judge(0.7, 0.8, 0.1, (3, 2)).promote  # 0.8 - 0.1 is 0.7 up to float noise
    worse = judge(0.0, 1.0, 0.05, (3, 2))
    assert not worse.promote
    assert "v3 scored 0.0000" in worse.reason and "serving v2 scored 1.0000" in worse.reason


def view(serving: int, *, newer: bool = False, rejected: tuple[int, ...] = ()) -> ServingView:
    return ServingView(serving, f"/ckpt/v{serving}", newer, frozenset(rejected))


def test_the_trainer_goes_back_on_a_rejected_head_or_a_rollback_only() -> None:
    lineage = {2, 3, 4}  # started from served v2, built candidates v3 and v4
    # nothing decided, or v3 promoted while the head v4 was trained on from it: go on
    assert reset_target(4, lineage, view(2), changed=False) is None
    assert reset_target(4, lineage, view(3), changed=True) is None
    assert reset_target(4, lineage, view(4), changed=True) is None
    # an older candidate rejected: the head is evaluated on its own
    assert reset_target(4, lineage, view(2, rejected=(3,)), changed=False) is None
    # the head rejected: back to the serving version
    assert reset_target(4, lineage, view(2, rejected=(3, 4)), changed=False) == 2
    # rolled back past the lineage, or back to an ancestor after a newer one was served
    assert reset_target(4, lineage, view(1, newer=True), changed=True) == 1
    assert reset_target(4, lineage, view(3, newer=True), changed=True) == 3
    # a serving version from elsewhere seen at start is not a change
    assert reset_target(4, lineage, view(7), changed=False) is None


def test_pruning_keeps_the_newest_the_serving_and_undecided_candidates() -> None:
    versions = [1, 2, 3, 4, 5, 6]
    assert prunable(versions, 2, set()) == [1, 2, 3, 4]
    assert prunable(versions, 2, {2, 4}) == [1, 3]
    assert prunable(versions, 10, set()) == []
    assert next_version(3, 7, 5) == 8 and next_version() == 1


def test_staleness_counts_versions_either_way_of_the_serving_one() -> None:
    assert is_stale(8, 3, 4) and not is_stale(7, 3, 4)  # after a rollback from v8 to v3
    assert is_stale(1, 6, 4) and not is_stale(2, 6, 4)


def test_the_weight_event_contract_for_candidates_rejections_and_rollbacks() -> None:
    WeightEvent(policy="p", version=3, status="candidate")
    WeightEvent(policy="p", version=2, status="ready", rolled_back_from=5)
    with pytest.raises(ValidationError, match="needs error"):
        WeightEvent(policy="p", version=3, status="rejected")
    with pytest.raises(ValidationError, match="rolled_back_from"):
        WeightEvent(policy="p", version=3, status="rejected", error="x", rolled_back_from=4)


def test_serving_settings_default_to_latest(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().serving.policy == "latest"
    monkeypatch.setenv("CLAW_SERVING__POLICY", "gated")
    monkeypatch.setenv("CLAW_SERVING__MARGIN", "0.05")
    settings = load_settings()
    assert settings.serving.policy == "gated" and settings.serving.margin == 0.05


def test_up_starts_a_candidate_engine_and_the_promoter_when_gated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CLAW_DATA_DIR", str(tmp_path))

    def planned() -> dict[str, str]:
        supervisor = Supervisor(load_settings())
        supervisor.plan()
        return {s.name: s.url for s in supervisor.services}

    assert "candidate-engine" not in planned() and "evaluator" not in planned()
    monkeypatch.setenv("CLAW_SERVING__POLICY", "gated")
    services = planned()
    assert services["candidate-engine"] == candidate_engines(load_settings())[0] + "/v1"
    assert "evaluator" in services
