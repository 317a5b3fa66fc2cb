"""GRPO groups reach the trainer whole: samples of a group are held until the group is
complete, so one step normalises each group's rewards over all of its trajectories.

A group is the sessions that share a `group_id` (a task's G attempts). It is released when
`size` of its sessions have a sample (and `settle_s` passed without another of its samples,
since a session may send several), or `timeout_s` after its first sample: a lost or failed
attempt never holds the others for ever. Samples with no group pass at once. While a sample
is held, the offsets the trainer may commit stop before it, so a crash loses none.

A released group whose rewards are all equal has no signal under group normalisation (every
advantage is zero: a trainer step on it teaches nothing), so with `skip_flat` it goes to
`flat` instead of a batch, and the batch waits for groups that have one (DAPO's dynamic
sampling). On the arithmetic tasks most groups of a 135M model were all failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from claw_stream.events import Sample


@dataclass
class _Group:
    first: float
    last: float
    samples: list[tuple[Sample, str, int]] = field(default_factory=list)  # sample, tp, offset

    @property
    def sessions(self) -> int:
        return len({s.session_id for s, _, _ in self.samples})


class GroupGate:
    def __init__(
        self, size: int | None, timeout_s: float, settle_s: float = 1.0, skip_flat: bool = False
    ):
        self.size = size
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self.skip_flat = skip_flat
        self.groups: dict[str, _Group] = {}
        self.passing: list[Sample] = []
        self.flat: list[list[Sample]] = []  # released groups without signal, for the caller

    def add(self, sample: Sample, tp: str, offset: int, now: float) -> None:
        if sample.group_id is None or self.size is None or self.size <= 1:
            self.passing.append(sample)
            return
        group = self.groups.setdefault(sample.group_id, _Group(now, now))
        if any(s.sample_id == sample.sample_id for s, _, _ in group.samples):
            return
        group.samples.append((sample, tp, offset))
        group.last = now

    def _due(self, group: _Group, now: float) -> bool:
        if now - group.first >= self.timeout_s:
            return True
        return (
            self.size is not None
            and group.sessions >= self.size
            and now - group.last >= self.settle_s
        )

    def release(self, now: float) -> list[Sample]:
        """Samples free to train now: ungrouped ones, then every complete or timed-out group."""
        out, self.passing = self.passing, []
        for group_id in [g for g, group in self.groups.items() if self._due(group, now)]:
            samples = [s for s, _, _ in self.groups.pop(group_id).samples]
            if self.skip_flat and len(samples) > 1 and len({s.reward for s in samples}) == 1:
                self.flat.append(samples)
            else:
                out.extend(samples)
        return out

    def take_flat(self) -> list[list[Sample]]:
        """The groups released without signal since the last call."""
        flat, self.flat = self.flat, []
        return flat

    def next_due(self, now: float) -> float | None:
        """Seconds until the next held group may be released; None when none is held."""
        waits = []
        for group in self.groups.values():
            wait = group.first + self.timeout_s - now
            if self.size is not None and group.sessions >= self.size:
                wait = min(wait, group.last + self.settle_s - now)
            waits.append(max(wait, 0.0))
        return min(waits, default=None)

    @property
    def held(self) -> int:
        return sum(len(g.samples) for g in self.groups.values())

    def safe_offsets(self, consumed: dict[str, int]) -> dict[str, int]:
        """The offsets to checkpoint and commit: the consumed ones, but never past a held sample."""
        safe = dict(consumed)
        for group in self.groups.values():
            for _, tp, offset in group.samples:
                safe[tp] = min(safe.get(tp, offset), offset)
        return safe
