"""The time filter of the commands that read recorded traffic (`replay`, `export`): `--since`
and `--until`, parsed and applied the same way by each."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(value: str) -> datetime:
    """ISO 8601 (a naive time is UTC) or a duration ago: 30m, 2h, 7d. ValueError otherwise."""
    if value and value[-1] in UNITS and value[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC) - timedelta(seconds=float(value[:-1]) * UNITS[value[-1]])
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is neither an ISO time (2026-11-23T10:00) nor a duration (30m, 2h, 7d)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class TimeRange:
    """[since, until): events are kept by their own `created_at`."""

    since: datetime
    until: datetime | None = None

    @classmethod
    def parse(cls, since: str, until: str | None = None) -> TimeRange:
        start, end = parse_time(since), parse_time(until) if until else None
        if end is not None and end <= start:
            raise ValueError("--until must be after --since")
        return cls(start, end)

    def __contains__(self, created: datetime) -> bool:
        return created >= self.since and (self.until is None or created < self.until)
