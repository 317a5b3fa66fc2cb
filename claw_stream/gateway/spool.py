"""An fsync'd, append-only local spool of records the broker could not take yet.

One JSON line per record (topic, key, base64 value). Records leave the spool only in order,
after the broker acknowledged them; a crash between the ack and the truncation re-sends the
head, which the drain then recognises on the topic and skips (see `publisher.py`).
"""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SpooledRecord:
    topic: str
    key: bytes
    value: bytes
    id_field: str  # the event's id field and value, to recognise it on the topic
    record_id: str

    def marker(self) -> bytes:
        return f'"{self.id_field}":"{self.record_id}"'.encode()


def _encode(r: SpooledRecord) -> str:
    row = {
        "topic": r.topic,
        "key": base64.b64encode(r.key).decode(),
        "value": base64.b64encode(r.value).decode(),
        "id_field": r.id_field,
        "id": r.record_id,
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
        with self._lock:
            with self.path.open("a") as f:
                f.write(_encode(record))
                f.flush()
                os.fsync(f.fileno())
            self._records.append(record)

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
