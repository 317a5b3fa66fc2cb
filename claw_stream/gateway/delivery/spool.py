"""An fsync'd, append-only local spool of records the broker could not take yet.

One JSON line per record (topic, key, base64 value). Records leave the spool only in order,
after the broker acknowledged them; a crash between the ack and the truncation re-sends the
head, which the drain then recognises on the topic and skips (see `publisher.py`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class SpooledRecord:
    topic: str
    key: bytes
    value: bytes
    id_field: str  # the event's id field and value, to recognise it on the topic
    record_id: str
    at: float = 0.0  # when it was spooled (wall clock)

    def marker(self) -> bytes:
        return f'"{self.id_field}":"{self.record_id}"'.encode()


def _encode(r: SpooledRecord) -> str:
    row = {
        "topic": r.topic,
        "key": base64.b64encode(r.key).decode(),
        "value": base64.b64encode(r.value).decode(),
        "id_field": r.id_field,
        "id": r.record_id,
        "at": r.at,
    }
    return json.dumps(row) + "\n"


def _decode(line: str) -> SpooledRecord:
    row = json.loads(line)
    return SpooledRecord(
        row["topic"],
        base64.b64decode(row["key"]),
        base64.b64decode(row["value"]),
        row["id_field"],
        row["id"],
        row.get("at", 0.0),
    )


class Spool:
    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "pending.jsonl"
        self._lock = threading.Lock()
        self._records: list[SpooledRecord] = self._load()

    def _load(self) -> list[SpooledRecord]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(_decode(line))
            except (json.JSONDecodeError, KeyError):  # a torn last line from a crash mid-write
                continue
        return records

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: SpooledRecord) -> None:
        if not record.at:
            record = replace(record, at=time.time())
        with self._lock:
            with self.path.open("a") as f:
                f.write(_encode(record))
                f.flush()
                os.fsync(f.fileno())
            self._records.append(record)

    def oldest_at(self) -> float | None:
        with self._lock:
            return self._records[0].at if self._records else None

    def head(self, n: int) -> list[SpooledRecord]:
        with self._lock:
            return self._records[:n]

    def pop(self, n: int) -> None:
        """Drop the first n records (after the broker acknowledged them), durably."""
        with self._lock:
            self._records = self._records[n:]
            tmp = self.path.with_suffix(".tmp")
            with tmp.open("w") as f:
                f.writelines(_encode(r) for r in self._records)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


class SpoolSlot:
    """One gateway process's spool under a shared folder, claimed with an exclusive flock.

    Several processes of one gateway (`--workers N`) each spool into their own slot
    (`BASE/0`, `BASE/1`, …). The lock dies with its process, SIGKILL included, so a restarted
    process claims the lowest free slot (usually the one its predecessor left) and drains it.
    `orphans` hands over the other slots no live process holds, to be drained too.
    """

    def __init__(self, base: Path):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.index = 0
        while (fd := _try_lock(base / f"{self.index}.lock")) is None:
            self.index += 1
        self._fd = fd
        self.directory = base / str(self.index)

    def orphans(self) -> list[tuple[Path, int]]:
        """Other slots with records and no live owner, each locked for the caller."""
        found = []
        for lock in sorted(self.base.glob("*.lock")):
            if (
                lock.stem == str(self.index)
                or not (self.base / lock.stem / "pending.jsonl").exists()
            ):
                continue
            fd = _try_lock(lock)
            if fd is not None:
                found.append((self.base / lock.stem, fd))
        return found

    def release(self) -> None:
        release_lock(self._fd)

    def depth(self) -> int:
        """Records waiting in every slot of the folder, as the files on disk hold them."""
        total = 0
        for path in self.base.glob("*/pending.jsonl"):
            with contextlib.suppress(OSError):
                total += path.read_bytes().count(b"\n")
        return total

    def oldest_age_s(self) -> float:
        """Seconds the oldest record in any slot of the folder has waited (0: none waits)."""
        now, oldest = time.time(), None
        for path in self.base.glob("*/pending.jsonl"):
            with contextlib.suppress(OSError, ValueError, KeyError), path.open() as f:
                at = json.loads(f.readline())["at"]
                oldest = at if oldest is None else min(oldest, at)
        return max(0.0, now - oldest) if oldest else 0.0


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def release_lock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
