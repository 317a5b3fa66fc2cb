"""The log files of the services the tests start (broker, Postgres, engines, gateways, workers,
trainers, whole stacks): shown with a test that fails while they were written, and read for
tracebacks after every test (tests/conftest.py).

A healthy service logs no traceback. After each test, what every service logged since the last
look is searched; a traceback fails the test that was running unless the test expects it
(`@pytest.mark.expected_traceback(pattern, reason=...)`) or it matches ALLOWED below, each entry
with its reason. Why: when the session's Postgres died mid-run, all later database tests failed
and nothing said why; and a gateway logged a traceback at every look of its archive check for
weeks (an OffsetFetch the embedded broker answers in a shape aiokafka cannot read) unseen."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TAIL = 3000  # characters shown
TRACEBACK = "Traceback (most recent call last):"
# Tansu is Rust: a panic is its traceback
PANIC = re.compile(r"thread '.*' panicked at")

# Tracebacks that are what a test means to cause, wherever they show: (pattern, reason).
ALLOWED: list[tuple[re.Pattern[str], str]] = []


@dataclass
class ServiceLog:
    name: str
    path: Path
    checked: int = 0  # bytes already searched for tracebacks


LOGS: dict[str, Path] = {}  # fixture name -> its service's log file (shown by name on failure)
WATCHED: dict[Path, ServiceLog] = {}
FOLDERS: dict[Path, str] = {}  # folders whose every file is a service's log (`claw-stream up`)


def log_file(fixture: str, folder: Path) -> Path:
    """The log of a fixture's service, named after the fixture."""
    path = folder / f"{fixture}.log"
    LOGS[fixture] = path
    return watch(fixture, path)


def watch(name: str, path: Path) -> Path:
    """Search this log for tracebacks after every test, and show it with a test that fails
    while it was written."""
    WATCHED.setdefault(path, ServiceLog(name, path))
    return path


def watch_folder(name: str, folder: Path) -> Path:
    """Every file that appears in `folder` is a log of `name`'s services."""
    FOLDERS[folder] = name
    return folder


def _all() -> list[ServiceLog]:
    for folder, name in FOLDERS.items():
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if path.is_file():
                    watch(f"{name}/{path.name}", path)
    return list(WATCHED.values())


def sizes() -> dict[Path, int]:
    out = {}
    for log in _all():
        try:
            out[log.path] = log.path.stat().st_size
        except OSError:
            out[log.path] = 0
    return out


def written_since(before: dict[Path, int]) -> list[ServiceLog]:
    """The logs that grew since `before` (sizes())."""
    now = sizes()
    return [WATCHED[p] for p, size in now.items() if size > before.get(p, 0)]


def tracebacks(text: str) -> list[str]:
    """Each traceback in a log's text (chained ones as one), with the two lines before it that
    say where it came from, and the exception line it ends with."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if TRACEBACK not in lines[i] and not PANIC.search(lines[i]):
            i += 1
            continue
        start, end = max(0, i - 2), i + 1
        while True:
            while end < len(lines) and lines[end][:1] in (" ", "\t"):
                end += 1  # the frames
            end = min(end + 1, len(lines))  # the exception
            j = end
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].startswith(("The above exception", "During handling")):
                k = j + 1
                while k < len(lines) and not lines[k].strip():
                    k += 1
                if k < len(lines) and TRACEBACK in lines[k]:
                    end = k + 1
                    continue
            break
        out.append("\n".join(lines[start:end]))
        i = end
    return out


def new_tracebacks(allowed: list[tuple[re.Pattern[str], str]]) -> list[tuple[str, str]]:
    """(service, traceback) for every traceback logged since the last look and not allowed."""
    found = []
    for log in _all():
        try:
            with log.path.open("rb") as f:
                f.seek(log.checked)
                data = f.read()
        except OSError:
            continue
        log.checked += len(data)
        for block in tracebacks(data.decode(errors="replace")):
            if not any(p.search(block) for p, _ in [*ALLOWED, *allowed]):
                found.append((log.name, block))
    return found


def tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return text[-TAIL:] or "(empty)"
