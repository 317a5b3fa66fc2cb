"""UUIDv7 ids (RFC 9562): time-ordered, so ids sort by creation and index well in Postgres.

Python 3.11 has no uuid7, hence the few lines here. `derive_uuid7` makes the id of an output
from the id of its input, so a processor that handles the same input twice (at-least-once
delivery, a crash and a restart) emits the same id and every consumer can dedupe by it.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def _build(unix_ms: int, rand74: int) -> uuid.UUID:
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand74 >> 62) & 0xFFF) << 64  # rand_a: 12 bits
    value |= 0b10 << 62  # variant
    value |= rand74 & ((1 << 62) - 1)  # rand_b: 62 bits
    return uuid.UUID(int=value)


def uuid7() -> uuid.UUID:
    """A new UUIDv7, strictly increasing within this process (monotonic random part)."""
    global _last_ms, _last_rand
    with _lock:
        now = time.time_ns() // 1_000_000
        if now <= _last_ms:
            now = _last_ms
            rand = _last_rand + 1 + int.from_bytes(os.urandom(2), "big")
            if rand >= 1 << 74:  # the random part is exhausted within this millisecond
                now, rand = now + 1, int.from_bytes(os.urandom(9), "big") >> 1
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 6
        _last_ms, _last_rand = now, rand
        return _build(now, rand)


def uuid7_time_ms(value: uuid.UUID) -> int:
    return value.int >> 80


def derive_uuid7(parent: uuid.UUID, label: str) -> uuid.UUID:
    """A deterministic UUIDv7 for (parent, label) that keeps the parent's timestamp."""
    digest = hashlib.sha256(parent.bytes + label.encode()).digest()
    return _build(uuid7_time_ms(parent), int.from_bytes(digest[:10], "big") >> 6)


def judgement_id_of(turn_id: uuid.UUID) -> uuid.UUID:
    """The id of a turn's judgement: one per turn, however often it is judged."""
    return derive_uuid7(turn_id, "judgement")


def is_held_out(turn_id: uuid.UUID, share: float) -> bool:
    """Whether a turn is in the held-out share (`eval.holdout_share`): never trained, answered
    again by each new version. A hash of the id, so the choice is stable across redeliveries,
    restarts and `claw-stream replay`, and ~`share` of every user's turns."""
    if share <= 0:
        return False
    digest = hashlib.sha256(turn_id.bytes + b"held-out").digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64
