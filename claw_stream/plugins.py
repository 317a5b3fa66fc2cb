"""Finding user code named in the settings: an import path `module:attribute` or the name of
an entry point in one of the project's groups (a package that declares, in its pyproject,
`[project.entry-points."claw_stream.rewards"] name = "module:attribute"`).

Loading is done once, when a service starts, so a bad path, a module that raises at import or
an object that cannot be called as its extension point calls it (`claw_stream.api`) stops the
service at once with a message naming the plugin, never at the first turn.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, cast

from claw_stream.api.loss import LOSS_ARGUMENTS, LossFunction
from claw_stream.api.replay_rule import REPLAY_RULE_ARGUMENTS, ReplayRule
from claw_stream.api.reward_source import SCORER_ARGUMENTS, Scorer

REWARDS_GROUP = "claw_stream.rewards"
LOSSES_GROUP = "claw_stream.losses"
GROUPS = (REWARDS_GROUP, LOSSES_GROUP)


class PluginError(RuntimeError):
    """A plugin that cannot be loaded or used; the message names it."""


@dataclass(frozen=True)
class Installed:
    group: str
    name: str
    target: str  # module:attribute
    distribution: str | None


def installed(group: str) -> list[Installed]:
    """The entry points of `group` in the installed distributions, by name."""
    found = []
    for ep in entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else None
        found.append(Installed(group, ep.name, ep.value, dist))
    return sorted(found, key=lambda i: i.name)


def load(spec: str, group: str, what: str) -> Any:
    """The object `spec` names: `module:attribute` (dotted attributes allowed), else an entry
    point of `group`. `what` says, in errors, where the name came from (a setting)."""
    if ":" not in spec:
        matches = list(entry_points(group=group, name=spec))
        if not matches:
            names = ", ".join(i.name for i in installed(group)) or "none installed"
            raise PluginError(
                f"{what}: {spec!r} is neither module:attribute nor an entry point of "
                f"{group} ({names})"
            )
        spec = matches[0].value
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise PluginError(f"{what}: {spec!r} must be module:attribute")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # a plugin's own import error: report it, naming the plugin
        raise PluginError(
            f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{what}: module {module_name!r} has no {attribute!r}") from None
    if not callable(obj):
        raise PluginError(f"{what}: {spec!r} is not callable")
    return obj


def misfit(obj: Any, arguments: Sequence[str]) -> str | None:
    """Why `obj` cannot be called with these positional arguments, None when it can (or when
    its signature cannot be read: a builtin is called as it is)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        name = getattr(obj, "__name__", type(obj).__name__)
        return f"cannot be called as {name}({', '.join(arguments)}): {exc}"
    return None


def load_as(spec: str, group: str, what: str, arguments: Sequence[str]) -> Any:
    """`load`, then PluginError naming `what` when the object does not take `arguments`."""
    obj = load(spec, group, what)
    if (problem := misfit(obj, arguments)) is not None:
        raise PluginError(f"{what}: {spec!r} {problem}")
    return obj


def load_scorer(spec: str, what: str) -> Scorer:
    """A reward source's scorer (`worker.rewards`)."""
    return cast("Scorer", load_as(spec, REWARDS_GROUP, what, SCORER_ARGUMENTS))


def load_loss_function(spec: str, what: str) -> LossFunction:
    """A loss (`trainer.loss`), called with every argument, `ref` too (None without KL)."""
    return cast("LossFunction", load_as(spec, LOSSES_GROUP, what, LOSS_ARGUMENTS))


def load_replay_rule(spec: str, what: str) -> ReplayRule:
    """The held-out replay's rule (`eval.replay_rule`)."""
    return cast("ReplayRule", load_as(spec, REWARDS_GROUP, what, REPLAY_RULE_ARGUMENTS))
