"""Where the repository-level `topics/` and `migrations/` folders are, in a checkout or a wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_PACKAGE.parent / name, _PACKAGE / "_data" / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the {name}/ folder next to the claw_stream package")


def topics_dir() -> Path:
    return _find("topics")


def migrations_dir() -> Path:
    return _find("migrations")
