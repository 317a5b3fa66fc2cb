"""Redaction rule: a function of a text that returns it with what must not be recorded
replaced, run by the gateway on every text of a Step after the patterns.

Named in `gateway.redaction.redactors` (`module:function`). It must depend on the text alone:
results are cached per text. One that raises makes the call's Step a dead letter, never a Step
with the text unredacted. Docs: docs/extending/redaction.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

__all__ = ["REDACTION_ARGUMENTS", "RedactionRule"]

RedactionRule: TypeAlias = Callable[[str], str]
REDACTION_ARGUMENTS = ("text",)
