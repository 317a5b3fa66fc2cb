"""The pure decisions of gated serving: promote or reject, where the trainer goes on from, and
which checkpoints pruning must keep."""

from __future__ import annotations

from dataclasses import dataclass

from claw_stream.evaluation.replay.pairs import won


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reason: str


def judge(candidate: float, serving: float, margin: float, versions: tuple[int, int]) -> Verdict:
    """Promote a candidate whose score is not below the serving version's by more than margin."""
    new, old = versions
    floor = serving - margin
    promote = candidate >= floor - 1e-9  # scores are ratios of small counts: no float noise
    verb = ">=" if promote else "<"
    return Verdict(
        promote,
        f"v{new} scored {candidate:.4f} {verb} {floor:.4f} "
        f"(serving v{old} scored {serving:.4f}, margin {margin:g})",
    )


def judge_replay(scores: list[float], margin: float, version: int) -> Verdict:
    """The held-out replay as a promotion criterion: the candidate's answers to held-out turns
    against the answers the users got (a win 1, a tie 1/2) must win at least 0.5 - margin."""
    rate = sum(won(s) for s in scores) / len(scores)
    floor = 0.5 - margin
    promote = rate >= floor - 1e-9
    verb = ">=" if promote else "<"
    return Verdict(
        promote,
        f"v{version} won {rate:.0%} {verb} {floor:.0%} of {len(scores)} held-out turns against "
        "the answers the users got",
    )


def both(task: Verdict, replay: Verdict | None) -> Verdict:
    """Promoted only when every criterion promotes; the reason names each."""
    if replay is None:
        return task
    return Verdict(task.promote and replay.promote, f"{task.reason}; {replay.reason}")


@dataclass(frozen=True)
class ServingView:
    """What Postgres says of the policy's versions (rows of weight_versions)."""

    serving: int  # the version of the newest ready_at (0: nothing published yet)
    serving_path: str | None
    served_newer: bool  # a version newer than `serving` was served before: it was rolled back
    rejected: frozenset[int]


def reset_target(head: int, lineage: set[int], view: ServingView, changed: bool) -> int | None:
    """The version a gated trainer must go on from instead of its head, if any.

    `lineage` holds the versions this trainer built since it last started from a served one
    (and that one). Its head rejected: back to the serving version. The serving version changed
    to one outside the lineage (a rollback past it, a version from elsewhere) or went back
    inside it (a rollback to an ancestor): go on from it. A promotion of a lineage version older
    than the head is the normal case (the head was trained on from it): nothing to do."""
    if view.serving == head:
        return None
    if head in view.rejected:
        return view.serving
    if changed and (view.serving not in lineage or view.served_newer):
        return view.serving
    return None


def prunable(versions: list[int], keep: int, protected: set[int]) -> list[int]:
    """Checkpoints to delete: all but the newest `keep` and the protected ones (the serving
    version's and undecided candidates')."""
    ordered = sorted(versions)
    return [v for v in ordered[: max(len(ordered) - keep, 0)] if v not in protected]


def next_version(*known: int) -> int:
    """Version numbers never repeat: one above every version known anywhere."""
    return max(known, default=0) + 1
