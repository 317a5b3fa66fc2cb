"""A lesson as the worker found it in one judged turn, before it is a skill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lesson:
    text: str
    source: str  # correction | feedback | hint | label | admin (skills.config.SOURCES)
    session_id: str
    step_id: str | None = None
    turn_id: str | None = None

    def provenance(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "step_id": self.step_id,
            "turn_id": self.turn_id,
            "source": self.source,
        }
