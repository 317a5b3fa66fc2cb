"""Steps this worker decoded lately, by id, under a budget of their JSON size.

The stitcher reads a session's whole open segment on every batch of its records (to classify
a new step against the main line and to give the turn before it its next state). Decoding
those steps again from Postgres each time was ~3% of the worker's CPU in
bench/pipeline_bench.py (3 steps a session), and grows with the segment: a conversation of n
steps decodes its history again on every step. A step's payload never changes once archived
(the first copy wins), so a step decoded once serves every later read of it.

Pure bookkeeping, no I/O: `segments.session_views` asks it which steps it holds, and Postgres
sends only the payloads of the others.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterable

from claw_stream.events import Step


class StepCache:
    """Least recently used first out, once the steps' JSON sizes add up past `max_bytes`
    (Python holds a decoded step in about 1 to 6 times its JSON: text about 1, token ids 6)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._steps: OrderedDict[uuid.UUID, tuple[Step, int]] = OrderedDict()
        self._of_session: dict[str, set[uuid.UUID]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._steps)

    def put(self, step: Step, size: int) -> None:
        """Hold `step` (its JSON `size` bytes); a step larger than the budget is not held."""
        if size > self.max_bytes:
            return
        self._drop(step.step_id)
        self._steps[step.step_id] = (step, size)
        self._of_session.setdefault(step.session_id, set()).add(step.step_id)
        self.bytes += size
        while self.bytes > self.max_bytes:
            oldest = next(iter(self._steps))
            self._drop(oldest)

    def held(self, session_ids: Iterable[str]) -> dict[uuid.UUID, Step]:
        """The steps held of these sessions, now (the caller keeps them while it reads the
        rest from Postgres, so an eviction meanwhile changes nothing)."""
        out: dict[uuid.UUID, Step] = {}
        for session_id in session_ids:
            for step_id in self._of_session.get(session_id, ()):
                self._steps.move_to_end(step_id)
                out[step_id] = self._steps[step_id][0]
        return out

    def count(self, hits: int, misses: int) -> None:
        self.hits += hits
        self.misses += misses

    def drop_sessions(self, session_ids: Iterable[str]) -> None:
        """Forget these sessions' steps (a forgotten session's data leaves memory too)."""
        for session_id in session_ids:
            for step_id in list(self._of_session.get(session_id, ())):
                self._drop(step_id)

    def _drop(self, step_id: uuid.UUID) -> None:
        held = self._steps.pop(step_id, None)
        if held is None:
            return
        step, size = held
        self.bytes -= size
        ids = self._of_session.get(step.session_id)
        if ids is not None:
            ids.discard(step_id)
            if not ids:
                del self._of_session[step.session_id]
