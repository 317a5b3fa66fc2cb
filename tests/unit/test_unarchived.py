"""The gateway's journal of events waiting for the archive: what a restarted gateway finds."""

from __future__ import annotations

from pathlib import Path

from claw_stream.gateway.delivery import unarchived as journal_module
from claw_stream.gateway.delivery.spool import SpooledRecord
from claw_stream.gateway.delivery.unarchived import Unarchived


def record(n: int, size: int = 10) -> SpooledRecord:
    value = b'{"step_id":"id-%d","pad":"' % n + b"x" * size + b'"}'
    return SpooledRecord("claw.steps", f"session-{n}".encode(), value, "step_id", f"id-{n}")


def test_a_restarted_gateway_finds_what_was_not_archived_byte_for_byte(tmp_path: Path) -> None:
    journal = Unarchived(tmp_path)
    for n in range(5):
        journal.add(record(n, size=n * 1000))
    journal.placed("id-1", 3, 42)
    journal.forget(["id-0", "id-3"])
    journal.close()

    again = Unarchived(tmp_path)
    assert sorted(again.entries) == ["id-1", "id-2", "id-4"]
    assert again.entries["id-1"].partition is None  # a position is not trusted across restarts
    for n in (1, 2, 4):
        assert again.record(again.entries[f"id-{n}"]) == record(n, size=n * 1000)


def test_a_write_torn_by_a_crash_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    journal = Unarchived(tmp_path)
    journal.add(record(1))
    journal.add(record(2, size=5000))
    journal.close()
    data = (tmp_path / "unarchived.jsonl").read_bytes()
    (tmp_path / "unarchived.jsonl").write_bytes(data[:-100])  # killed mid-write of id-2

    again = Unarchived(tmp_path)
    assert list(again.entries) == ["id-1"]
    again.add(record(3))  # appends after the last whole entry
    again.close()
    assert sorted(Unarchived(tmp_path).entries) == ["id-1", "id-3"]


def test_the_file_is_compacted_once_mostly_forgotten(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(journal_module, "COMPACT_MIN_DEAD", 10)
    journal = Unarchived(tmp_path)
    for n in range(30):
        journal.add(record(n, size=2000))
    before = (tmp_path / "unarchived.jsonl").stat().st_size
    journal.forget([f"id-{n}" for n in range(28)])
    assert (tmp_path / "unarchived.jsonl").stat().st_size < before / 5
    journal.add(record(99))
    assert journal.record(journal.entries["id-28"]) == record(28, size=2000)
    journal.close()
    assert sorted(Unarchived(tmp_path).entries) == ["id-28", "id-29", "id-99"]


def test_a_dead_process_journal_is_adopted_whole(tmp_path: Path) -> None:
    dead = Unarchived(tmp_path / "1")
    dead.add(record(7, size=300))
    alive = Unarchived(tmp_path / "0")
    alive.add(record(1))
    alive.adopt(Unarchived(tmp_path / "1"))
    assert sorted(alive.entries) == ["id-1", "id-7"]
    assert alive.record(alive.entries["id-7"]) == record(7, size=300)
    assert not (tmp_path / "1" / "unarchived.jsonl").exists()
