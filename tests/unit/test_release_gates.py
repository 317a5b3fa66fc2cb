"""A sample is held and aged against the versions of whoever answered it: the shared policy, or
a tenant whose own adapter (`tenant@vN`) did (its `weight_version` is then the tenant's)."""

from __future__ import annotations

import uuid

from claw_stream.events import Sample
from claw_stream.worker.logic.release import Gate, Gates, decide, decide_held, policies_of
from claw_stream.worker.logic.samples import Draft, served_by

from ..support.factories import make_sample, make_step


def of(policy: str | None, version: int) -> Sample:
    return make_sample().model_copy(
        update={
            "sample_id": uuid.uuid4(),
            "policy": policy,
            "tenant": policy,
            "weight_version": version,
            "released_at_version": version,
        }
    )


GATES = Gates(
    "policy",
    {"policy": Gate(version=40, updating=False), "alice": Gate(version=3, updating=False)},
)


def test_each_sample_is_judged_by_its_own_policys_versions() -> None:
    shared_old, shared_new, alices = of(None, 2), of(None, 39), of("alice", 2)
    decided = decide([Draft(s, True) for s in (shared_old, shared_new, alices)], GATES, 4)
    assert [status for status, _ in decided] == ["dropped", "pending", "pending"]
    # released at its own policy's version: alice's v3, not the shared v40
    assert [s.released_at_version for _, s in decided[1:]] == [40, 3]
    assert policies_of([alices, shared_old], "policy") == {"policy", "alice"}


def test_a_tenants_update_holds_only_its_own_samples() -> None:
    gates = Gates("policy", {**GATES.by_policy, "alice": Gate(version=3, updating=True)})
    decided = decide_held([of("alice", 3), of(None, 40)], gates, 4)
    assert [status for status, _ in decided] == ["held", "pending"]


def test_a_step_is_the_tenants_when_its_own_adapter_answered() -> None:
    step = make_step()
    cases = {
        ("alice", "alice@v3"): "alice",
        ("alice", "policy@v7"): None,  # the shared policy's adapter answered her
        ("alice", "policy"): None,
        (None, "policy@v7"): None,
        ("bob", "alice@v3"): None,  # never another tenant's
    }
    for (tenant, served), expected in cases.items():
        assert served_by(step.model_copy(update={"tenant": tenant, "served_model": served})) == (
            expected
        )
