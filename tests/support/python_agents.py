"""The real coding agents from PyPI (aider, Hermes Agent), each in a virtualenv of its own in
the test cache at the version its requests were recorded with: their pinned dependencies
(litellm, openai, ...) never meet the project's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

from .coding_agents import agent_env as npm_agent_env
from .paths import CACHE

# command -> the distribution that installs it, at the version tests/fixtures/agents/ holds
PACKAGES = {"aider": "aider-chat==0.86.2", "hermes": "hermes-agent==0.19.0"}
VENVS = CACHE / "python-agents"
INSTALLED = ".claw-installed"  # what the venv holds, written once its install succeeded


def _venv(command: str) -> Path:
    return VENVS / PACKAGES[command].split("==")[0]


def _ready(command: str) -> Path | None:
    venv = _venv(command)
    marker = venv / INSTALLED
    executable = venv / "bin" / command
    if executable.exists() and marker.exists() and marker.read_text() == PACKAGES[command]:
        return executable
    return None


def install(command: str) -> tuple[Path | None, str]:
    """The agent's command, installed once into its own venv in the test cache; (None, why)
    when pip cannot install it (no registry: the test that needs it skips with that reason)."""
    if (ready := _ready(command)) is not None:
        return ready, ""
    VENVS.mkdir(parents=True, exist_ok=True)
    with FileLock(str(VENVS / f".{command}.lock")):  # tests/support/warm.py may be at it
        if (ready := _ready(command)) is not None:
            return ready, ""
        venv = _venv(command)
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", PACKAGES[command]],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                return None, f"pip could not install {PACKAGES[command]}: {done.stderr[-500:]}"
        (venv / INSTALLED).write_text(PACKAGES[command])
        return _ready(command), ""


def agent_env(**extra: str) -> dict[str, str]:
    """The environment a Python agent runs in: nothing of the developer's own agent
    configuration (theirs, litellm's, the OpenAI SDK's)."""
    env = npm_agent_env(**extra)
    for name in list(env):
        if name.startswith(("AIDER_", "HERMES_", "LITELLM_", "OPENROUTER_")) and name not in extra:
            del env[name]
    env.pop("VIRTUAL_ENV", None)
    return env


def require(found: Path | None, why: str) -> Path:
    """A test's agent: skipped with `why` where it could not be installed, failed instead
    with CLAW_REQUIRE_AGENTS=1 (a run that must exercise the real agents)."""
    import pytest

    if found is None:
        if os.environ.get("CLAW_REQUIRE_AGENTS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found
