"""The journal of events the gateway published that the worker has not archived yet.

The embedded broker keeps records in memory: one it acknowledged and then lost in a restart
would be gone although the gateway had answered its call. So an acknowledgement from the
broker is not the end of a Step's road: it stays here until the archive in Postgres holds it
(or the worker's committed offset passed it), and is sent again when it is no longer on its
topic (see `archive_check.py`).

One file, appended to: an entry is a JSON header line, the record's value, a newline; a line
`{"done": [...]}` forgets ids. Values stay on disk (a Step of an OpenClaw call is ~150 KB, and
a worker down for an hour would hold thousands); memory holds ids, offsets and positions. The
file is not fsync'd per record: a gateway killed by a signal loses nothing (the page cache
keeps the write), and a power loss loses no more than the broker's own memory did. A
background flush fsyncs it about once a second.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from claw_stream.gateway.delivery.spool import SpooledRecord

COMPACT_MIN_DEAD = 2_000  # forgotten entries before the file is rewritten without them


@dataclass
class Entry:
    record_id: str
    topic: str
    key: bytes
    id_field: str
    at: float  # when it was first published (wall clock)
    offset_in_file: int
    length: int
    partition: int | None = None  # where the broker put it, when known
    offset: int | None = None
    next_check: float = 0.0  # when to look for it on its topic again (monotonic)
    checks: int = 0
    next_query: float = 0.0  # when to ask the archive again (monotonic)
    queries: int = 0


def _header_line(entry: Entry) -> bytes:
    header = {
        "id": entry.record_id,
        "topic": entry.topic,
        "key": entry.key.decode("latin-1"),
        "id_field": entry.id_field,
        "at": entry.at,
        "len": entry.length,
    }
    return json.dumps(header, separators=(",", ":")).encode() + b"\n"


class Unarchived:
    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "unarchived.jsonl"
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self._dead = 0
        self._load()
        self._file = self.path.open("ab")
        self._dirty = False

    def __len__(self) -> int:
        return len(self.entries)

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        pos = 0
        good = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break
            try:
                header = json.loads(data[pos:end])
            except ValueError:
                break
            if "done" in header:
                for record_id in header["done"]:
                    if self.entries.pop(record_id, None) is not None:
                        self._dead += 1
                pos = good = end + 1
                continue
            start, length = end + 1, header["len"]
            if start + length + 1 > len(data):  # torn by a crash mid-write
                break
            self.entries[header["id"]] = Entry(
                header["id"],
                header["topic"],
                header["key"].encode("latin-1"),
                header["id_field"],
                header["at"],
                start,
                length,
            )
            pos = good = start + length + 1
        if good < len(data):
            with self.path.open("r+b") as f:
                f.truncate(good)

    def add(self, record: SpooledRecord) -> Entry:
        entry = Entry(
            record.record_id,
            record.topic,
            record.key,
            record.id_field,
            time.time(),
            0,
            len(record.value),
        )
        line = _header_line(entry)
        with self._lock:
            entry.offset_in_file = self._file.tell() + len(line)
            self._file.write(line + record.value + b"\n")
            self._file.flush()
            self._dirty = True
            self.entries[record.record_id] = entry
        return entry

    def placed(self, record_id: str, partition: int, offset: int) -> None:
        entry = self.entries.get(record_id)
        if entry is not None:
            entry.partition, entry.offset = partition, offset

    def record(self, entry: Entry) -> SpooledRecord:
        with self.path.open("rb") as f:
            f.seek(entry.offset_in_file)
            value = f.read(entry.length)
        return SpooledRecord(entry.topic, entry.key, value, entry.id_field, entry.record_id)

    def forget(self, record_ids: list[str]) -> None:
        gone = [r for r in record_ids if r in self.entries]
        if not gone:
            return
        with self._lock:
            for record_id in gone:
                del self.entries[record_id]
            self._file.write(json.dumps({"done": gone}).encode() + b"\n")
            self._file.flush()
            self._dirty = True
            self._dead += len(gone)
        if self._dead >= COMPACT_MIN_DEAD and self._dead > 2 * len(self.entries):
            self.compact()

    def sync(self) -> None:
        """fsync what was written since the last call (called from a thread, ~once a second)."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            fd = self._file.fileno()
        os.fsync(fd)

    def compact(self) -> None:
        """Rewrite the file with the live entries only."""
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            with self.path.open("rb") as old, tmp.open("wb") as new:
                for entry in self.entries.values():
                    old.seek(entry.offset_in_file)
                    value = old.read(entry.length)
                    new.write(_header_line(entry))
                    entry.offset_in_file = new.tell()
                    new.write(value + b"\n")
                new.flush()
                os.fsync(new.fileno())
            self._file.close()
            os.replace(tmp, self.path)
            self._file = self.path.open("ab")
            self._dead = 0

    def adopt(self, other: Unarchived) -> None:
        """Take over the entries of a slot whose process died (their positions are unknown)."""
        for entry in list(other.entries.values()):
            if entry.record_id not in self.entries:
                self.add(other.record(entry)).at = entry.at
        other.close()
        other.path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._file.close()
