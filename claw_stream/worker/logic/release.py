"""Where a sample goes when it is written: the policy's gate decides (pure; the outbox writes it).

`no_signal`: nothing to learn from (every reward source abstained); `held`: a weight update is
open, so it waits for the new version; `dropped`: it is older than `max_staleness` versions;
`pending`: published now, stamped with the version it is released at.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from claw_stream.events import Sample
from claw_stream.worker.logic.rewards import is_stale
from claw_stream.worker.logic.samples import Draft


@dataclass(frozen=True)
class Gate:
    """Where the policy stands: the newest ready version and whether an update is open."""

    version: int
    updating: bool


Decided = tuple[str, Sample]  # (release status, the sample as written)


@dataclass(frozen=True)
class Gates:
    """Each policy's gate: the shared policy's, and a tenant's whose adapter answered.

    A sample's `weight_version` is a version of `sample.policy` (a tenant's adapter) or, when
    that is None, of the shared policy: it is held and aged against that one's versions."""

    shared: str
    by_policy: dict[str, Gate]

    def of(self, sample: Sample) -> Gate:
        return self.by_policy[sample.policy or self.shared]


def policies_of(samples: Iterable[Sample], shared: str) -> set[str]:
    """The policies whose gates decide these samples."""
    return {s.policy or shared for s in samples} | {shared}


def release_status(sample: Sample, signal: bool, g: Gate, max_staleness: int) -> str:
    if not signal:
        return "no_signal"
    if g.updating:
        return "held"
    if is_stale(sample.weight_version, g.version, max_staleness):
        return "dropped"
    return "pending"


def released(sample: Sample, g: Gate) -> Sample:
    return sample.model_copy(update={"released_at_version": max(g.version, sample.weight_version)})


def decide(drafts: Iterable[Draft], gates: Gates, max_staleness: int) -> list[Decided]:
    """Each new sample's status, once per sample id (a draft made twice is written once)."""
    out: dict[object, Decided] = {}
    for draft in drafts:
        g = gates.of(draft.sample)
        status = release_status(draft.sample, draft.has_signal, g, max_staleness)
        sample = released(draft.sample, g) if status == "pending" else draft.sample
        out.setdefault(sample.sample_id, (status, sample))
    return list(out.values())


def decide_held(samples: Iterable[Sample], gates: Gates, max_staleness: int) -> list[Decided]:
    """Held samples whose policy has no update open: stale ones dropped, the others made
    pending (those whose policy is still updating stay held)."""
    out: list[Decided] = []
    for sample in samples:
        g = gates.of(sample)
        status = release_status(sample, True, g, max_staleness)
        out.append((status, released(sample, g) if status == "pending" else sample))
    return out
