"""`claw-stream connect AGENT`: our provider written into a coding agent's own config file.

Each agent keeps its settings in a file of its own; connecting one merges our entry into it
and leaves everything else as it was: other providers, keys, comments (TOML) and order.
Running it twice changes nothing the second time; a file that cannot be read is left
untouched with a one-line error; the file as it was before a change is kept beside it, and
the file as it was before the first connect too, which `connect --undo` puts back. Each
agent's file and what is merged into it: `claude_code.py`, `codex.py`, `openclaw.py`,
`zeroclaw.py`, `opencode.py`, `aider.py`, `hermes.py` (and `gemini.py`).

Which key. Claude Code and Codex name their own sessions (`agents/recognition.py`), and so does
OpenClaw once `sendSessionAffinityHeaders` is on (`session_id`, `x-client-request-id`,
`x-session-affinity`: the session is `openclaw-<id>`): they get a key of the client kind, not
a session key, which would hold every run in one session whatever their headers say (a
session key's session always wins). ZeroClaw names no session: it gets a fresh session key
(`/rl/start_session`), which ties its calls together and lets a script reward them by key.
Gemini CLI names none either, but each of its calls carries the conversation so far: it gets
a client key, and the gateway files each conversation as one session by its main line.
opencode names its sessions (`x-session-id`: the session is `opencode-<id>`) and gets a
client key; so does Hermes Agent, which names none but resends each conversation whole. aider
names none and resends its conversation otherwise than it sent it (`aider.py`): it gets a fresh
session key, as ZeroClaw does.
Without `--key`, a key already written in our entry is kept, so a second run changes nothing.

Some agents keep part of their set-up in a second file (Gemini CLI's base URL and key in the
`.env` beside its settings.json: `gemini.py`): `AgentSetup.beside`, changed, kept and undone
with the first.
"""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claw_stream.agents import (
    aider,
    claude_code,
    codex,
    gemini,
    hermes,
    openclaw,
    opencode,
    zeroclaw,
)
from claw_stream.agents.codex import CODEX_KEY_ENV
from claw_stream.agents.prompts import expectations
from claw_stream.agents.target import PROVIDER, AgentConfigFileError, Target
from claw_stream.agents.zeroclaw import ZEROCLAW_ALIAS

BACKUP_SUFFIX = ".claw-stream.bak"  # the file before the latest change
ORIGINAL_SUFFIX = ".claw-stream.orig"  # the file before the first connect, for --undo
ABSENT_SUFFIX = ".claw-stream.absent"  # there was no file before the first connect


@dataclass(frozen=True)
class AgentFile:
    """Another file an agent's set-up merges into, in its config file's folder (Gemini CLI's
    `.env` beside its `settings.json`): changed, kept and undone as the config file is."""

    name: str
    merge: Callable[[str, Target], str]


@dataclass(frozen=True)
class AgentSetup:
    """How `connect` sets an agent up: where its config is, what is merged into it."""

    name: str
    path: Callable[[], Path]  # where its config lives on this machine
    merge: Callable[[str, Target], str]
    then: Callable[[Target], str]  # what the user does next, in words
    session_key: bool = False  # it names no session of its own: give it a fresh session key
    stored_key: Callable[[str], str | None] | None = None  # the key our entry already has
    notes: Callable[[str, str, Target], list[str]] | None = None  # (before, after, target)
    beside: tuple[AgentFile, ...] = ()  # files merged beside the config file


AGENTS = {
    "claude-code": AgentSetup(
        "claude-code",
        claude_code.config_path,
        claude_code.merge,
        lambda t: "run `claude` as usual: it talks to the gateway",
        notes=lambda before, after, t: expectations("claude-code", t),
    ),
    "codex": AgentSetup(
        "codex",
        codex.config_path,
        codex.merge,
        lambda t: f"export {CODEX_KEY_ENV}={t.key}, then run `codex` as usual",
        notes=lambda before, after, t: expectations("codex", t),
    ),
    "openclaw": AgentSetup(
        "openclaw",
        openclaw.config_path,
        openclaw.merge,
        lambda t: f"run `openclaw` as usual: its default model is {PROVIDER}/{t.model}",
        stored_key=openclaw.stored_key,
        notes=openclaw.notes,
    ),
    "zeroclaw": AgentSetup(
        "zeroclaw",
        zeroclaw.config_path,
        zeroclaw.merge,
        lambda t: (
            f"run `zeroclaw agent -a {ZEROCLAW_ALIAS}` (an agent of its own; the others "
            "are as they were)"
        ),
        session_key=True,
        stored_key=zeroclaw.stored_key,
    ),
    "opencode": AgentSetup(
        "opencode",
        opencode.config_path,
        opencode.merge,
        lambda t: f"run `opencode` as usual: its model is {PROVIDER}/{t.model}",
        stored_key=opencode.stored_key,
        notes=opencode.notes,
    ),
    "gemini": AgentSetup(
        "gemini",
        gemini.config_path,
        gemini.merge,
        lambda t: (
            "run `gemini` in a folder you trust (it reads ~/.gemini/.env there only: trust "
            "it when it asks, or set GEMINI_CLI_TRUST_WORKSPACE=true for `gemini -p`)"
        ),
        notes=gemini.notes,
        beside=(AgentFile(gemini.ENV_FILE, gemini.merge_env),),
    ),
    "aider": AgentSetup(
        "aider",
        aider.config_path,
        aider.merge,
        lambda t: f"run `aider` as usual: its model is {aider.model_name(t)}",
        session_key=True,  # its calls cannot be joined by their main line: aider.py
        stored_key=aider.stored_key,
        notes=aider.notes,
        beside=(AgentFile(aider.METADATA_FILE, aider.merge_metadata),),
    ),
    "hermes": AgentSetup(
        "hermes",
        hermes.config_path,
        hermes.merge,
        lambda t: f"run `hermes` as usual: its model is {t.model}, provider custom",
        stored_key=hermes.stored_key,
        notes=hermes.notes,
    ),
}


@dataclass(frozen=True)
class Change:
    path: Path
    before: str
    after: str
    notes: tuple[str, ...] = ()  # what the user should know of it, one line each

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.before.splitlines(keepends=True),
                self.after.splitlines(keepends=True),
                f"{self.path} (now)",
                f"{self.path} (connected)",
            )
        )


def _read(agent: AgentSetup, path: Path | None) -> tuple[Path, str]:
    where = path or agent.path()
    return where, where.read_text() if where.exists() else ""


def stored_key(agent: AgentSetup, path: Path | None = None) -> str | None:
    """The key our entry in the agent's file already has (None: none, or an agent whose key
    is not kept there); AgentConfigFileError when the file cannot be connected."""
    where, text = _read(agent, path)
    if agent.stored_key is None:
        return None
    try:
        return agent.stored_key(text)
    except AgentConfigFileError as exc:
        raise AgentConfigFileError(f"{where}: {exc} (left untouched)") from None


def plan(agent: AgentSetup, target: Target, path: Path | None = None) -> Change:
    """What connecting `agent` would change; AgentConfigFileError when its file cannot be
    read."""
    where, before = _read(agent, path)
    try:
        after = agent.merge(before, target)
    except AgentConfigFileError as exc:
        raise AgentConfigFileError(f"{where}: {exc} (left untouched)") from None
    notes = tuple(agent.notes(before, after, target)) if agent.notes else ()
    return Change(where, before, after, notes)


def plans(agent: AgentSetup, target: Target, path: Path | None = None) -> list[Change]:
    """What connecting `agent` would change in each of its files: its config file's first,
    then those beside it."""
    main = plan(agent, target, path)
    out = [main]
    for other in agent.beside:
        where = main.path.parent / other.name
        before = where.read_text() if where.exists() else ""
        try:
            out.append(Change(where, before, other.merge(before, target)))
        except AgentConfigFileError as exc:
            raise AgentConfigFileError(f"{where}: {exc} (left untouched)") from None
    return out


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def write(change: Change) -> Path | None:
    """Write a change, keeping the file as it was beside it; the backup's path, if any. The
    first change also keeps the file as it was before any (or notes there was none)."""
    if not change.changed:
        return None
    change.path.parent.mkdir(parents=True, exist_ok=True)
    original, absent = _beside(change.path, ORIGINAL_SUFFIX), _beside(change.path, ABSENT_SUFFIX)
    first = not original.exists() and not absent.exists()
    backup = None
    if change.path.exists():
        backup = _beside(change.path, BACKUP_SUFFIX)
        shutil.copy2(change.path, backup)
        if first:
            shutil.copy2(change.path, original)
    elif first:
        absent.touch()
    partial = _beside(change.path, ".claw-stream.tmp")
    partial.write_text(change.after)
    partial.replace(change.path)  # whole or not at all
    return backup


@dataclass(frozen=True)
class Undo:
    """Putting an agent's file back as it was before the first connect."""

    path: Path
    now: str  # the file as it is ("" when there is none)
    was: str | None  # as it was before the first connect; None: there was no file

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.now.splitlines(keepends=True),
                (self.was or "").splitlines(keepends=True),
                f"{self.path} (now)",
                f"{self.path} (before connect)" if self.was is not None else "/dev/null",
            )
        )


def plan_undo(agent: AgentSetup, path: Path | None = None) -> Undo:
    """What `connect --undo` would do; AgentConfigFileError when connect never wrote the
    file (so there is nothing to put back)."""
    where, now = _read(agent, path)
    original = _beside(where, ORIGINAL_SUFFIX)
    if original.exists():
        return Undo(where, now, original.read_bytes().decode(errors="replace"))
    if _beside(where, ABSENT_SUFFIX).exists():
        return Undo(where, now, None)
    raise AgentConfigFileError(
        f"{where}: nothing to undo: `claw-stream connect {agent.name}` has not changed it "
        f"(no {original.name} beside it)"
    )


def plan_undos(agent: AgentSetup, path: Path | None = None) -> list[Undo]:
    """`plan_undo` for each of the agent's files that connect changed (its config file's
    first); AgentConfigFileError when it changed none."""
    where = path or agent.path()
    out, refused = [], None
    for each in (where, *(where.parent / other.name for other in agent.beside)):
        try:
            out.append(plan_undo(agent, each))
        except AgentConfigFileError as exc:
            refused = refused or exc
    if not out:
        assert refused is not None
        raise refused
    return out


def undo(change: Undo) -> None:
    """Put the file back byte for byte (or remove it, where there was none) and forget the
    copies connect kept beside it."""
    original = _beside(change.path, ORIGINAL_SUFFIX)
    if change.was is None:
        change.path.unlink(missing_ok=True)
    else:
        partial = _beside(change.path, ".claw-stream.tmp")
        shutil.copy2(original, partial)  # its bytes and mode, as they were
        partial.replace(change.path)
    for suffix in (ORIGINAL_SUFFIX, ABSENT_SUFFIX, BACKUP_SUFFIX):
        _beside(change.path, suffix).unlink(missing_ok=True)


def served_model(models: dict[str, Any]) -> tuple[str, int | None]:
    """The first model a `GET /v1/models` answer lists, and its context where it says."""
    data = models.get("data") or []
    if not data or not isinstance(data[0], dict) or not data[0].get("id"):
        raise ValueError("the gateway lists no model (GET /v1/models)")
    context = data[0].get("max_model_len")
    return str(data[0]["id"]), context if isinstance(context, int) else None
