"""Finding user code named in the settings: an import path `module:attribute` or the name of
an entry point in one of the project's groups (a package that declares, in its pyproject,
`[project.entry-points."claw_stream.rewards"] name = "module:attribute"`).

Loading is done once, when a service starts, so a bad path or a module that raises at import
stops the service at once with a message naming the plugin, never at the first turn.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

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
