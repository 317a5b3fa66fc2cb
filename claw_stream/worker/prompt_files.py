"""Judge and hint prompts from files (`prompt_file` of the prm source, `hint_prompt_file`),
checked when the worker or `claw-stream replay` starts: a prompt without the placeholder it
needs, or with one the judge does not fill, would judge every turn wrongly and silently.

A prompt file is the judge's whole user message; `{transcript}` is replaced by the turn as the
judge reads it (bounded to the judge's context). Other braces (`\\boxed{1}`) are left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from claw_stream.worker.config import WorkerSettings

PLACEHOLDER = "{transcript}"
_NAMED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PromptError(ValueError):
    """A prompt file that cannot be read or lacks what its judge needs; names the file."""


@dataclass(frozen=True)
class JudgePrompts:
    prm: str | None = None  # None: the built-in PRM_SYSTEM prompt
    hint: str | None = None  # None: the built-in OPD_SYSTEM prompt


def check_prompt(text: str, where: str, needs: tuple[str, ...]) -> str:
    """`text` when it holds {transcript}, no other {placeholder}, and each of `needs` (what
    the answer parser looks for)."""
    if PLACEHOLDER not in text:
        raise PromptError(f"{where}: has no {PLACEHOLDER} placeholder (where the turn goes)")
    unknown = sorted({m for m in _NAMED.findall(text) if m != "transcript"})
    if unknown:
        raise PromptError(
            f"{where}: unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
            f"only {PLACEHOLDER} is filled"
        )
    missing = [n for n in needs if n not in text]
    if missing:
        raise PromptError(
            f"{where}: must ask for {' and '.join(missing)} (the judge's answer is parsed for it)"
        )
    return text


def read_prompt(path: Path, setting: str, needs: tuple[str, ...]) -> str:
    where = f"{setting} {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PromptError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PromptError(f"{where}: is not UTF-8 text") from None
    return check_prompt(text, where, needs)


def load_prompts(config: WorkerSettings) -> JudgePrompts:
    """The configured prompt files, read and checked (PromptError names the bad one)."""
    prm = config.prm_source
    prm_text = None
    if prm is not None and prm.prompt_file is not None:
        prm_text = read_prompt(prm.prompt_file, "worker.rewards[prm].prompt_file", ("\\boxed",))
    hint_text = None
    if config.hint_prompt_file is not None:
        hint_text = read_prompt(
            config.hint_prompt_file,
            "worker.hint_prompt_file",
            ("\\boxed", "[HINT_START]", "[HINT_END]"),
        )
    return JudgePrompts(prm=prm_text, hint=hint_text)
