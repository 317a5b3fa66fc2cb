"""The log files of the services the fixtures start (broker, Postgres), shown with a test that
fails while using them (tests/conftest.py): when the session's Postgres died mid-run, all
later database tests failed and nothing said why."""

from __future__ import annotations

from pathlib import Path

LOGS: dict[str, Path] = {}  # fixture name -> its service's log file
TAIL = 3000  # characters shown


def log_file(fixture: str, folder: Path) -> Path:
    path = folder / f"{fixture}.log"
    LOGS[fixture] = path
    return path


def tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return text[-TAIL:] or "(empty)"
