"""Replay rule: scores one answer to a held-out request, higher better, where the held-out
replay asks a version again what real users asked and compares its answer with theirs.

Named by `eval.replay_rule` (`module:function`, or an entry point of the group
`claw_stream.rewards`) and called `fn(request, answer)`: the request body as the user's agent
sent it (its `messages` and `tools`) and the new answer's text. Docs:
docs/extending/reward-source.md, "The held-out replay's rule".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

__all__ = ["REPLAY_RULE_ARGUMENTS", "ReplayRule"]

ReplayRule: TypeAlias = Callable[[dict[str, Any], str], float]
REPLAY_RULE_ARGUMENTS = ("request", "answer")
