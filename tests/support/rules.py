"""Replay rules the tests name by `module:function` (`eval.replay_rule`), as a user's own."""

from __future__ import annotations

from typing import Any


def under_30_words(request: dict[str, Any], answer: str) -> float:
    """The taste of a user who wants short answers: 1 for under 30 words."""
    return float(0 < len(answer.split()) < 30)
