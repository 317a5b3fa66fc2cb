"""Events this worker sent to a topic it also reads, by their exact bytes, until read back.

The stitcher's turns go to claw.turns and come back to the judge agent; the judge's judgements
go to claw.judgements and come back to the assembler: with one worker, or keys that land on
the partitions it owns, both are read by the process that wrote them. Each carries its whole
step (prompt, messages, token ids), and decoding the judgements again was ~13% of the worker's
CPU in bench/pipeline_bench.py (the largest single item, ahead of every SQL statement).

A record read back whose bytes equal, byte for byte, bytes this worker encoded from an event
is that event: `encode_event` of a valid event decodes to an equal one, so validation would
find nothing. Any other record (another worker's, a replay, a hand-written one) is decoded
and validated as before, and bad input still goes to the DLQ.

Pure bookkeeping, no I/O. Entries leave when read back, when their session is forgotten, or
oldest first past `max_bytes` (another worker may be the one that reads them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from claw_stream.events import E, Event


class OwnEvents:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._events: OrderedDict[bytes, tuple[Event, str]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._events)

    def sent(self, raw: bytes, event: Event, session_id: str) -> None:
        """`raw` is `encode_event(event)`, just sent."""
        if len(raw) > self.max_bytes:
            return
        if raw in self._events:
            return
        self._events[raw] = (event, session_id)
        self.bytes += len(raw)
        while self.bytes > self.max_bytes:
            oldest, _ = self._events.popitem(last=False)
            self.bytes -= len(oldest)

    def take(self, model: type[E], raw: bytes) -> E | None:
        """The event `raw` was encoded from, once (None when it was not sent from here)."""
        held = self._events.get(raw)
        if held is None or type(held[0]) is not model:
            self.misses += 1
            return None
        del self._events[raw]
        self.bytes -= len(raw)
        self.hits += 1
        return held[0]

    def discard(self, raws: Iterable[bytes]) -> None:
        """Not sent after all (the send failed)."""
        for raw in raws:
            if self._events.pop(raw, None) is not None:
                self.bytes -= len(raw)

    def drop_sessions(self, session_ids: Iterable[str]) -> None:
        """A forgotten session's events leave memory too."""
        gone = set(session_ids)
        if not gone:
            return
        for raw in [raw for raw, (_, sid) in self._events.items() if sid in gone]:
            del self._events[raw]
            self.bytes -= len(raw)
