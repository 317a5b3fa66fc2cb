"""The real agents read what `claw-stream connect` writes into a user's own config file:
OpenClaw's `config validate`, opencode's `debug config` and Hermes Agent's `config show`, each
from its registry at the version its recordings were made with. The unit lane checks the text
connect writes (tests/unit/test_connect.py); only the agents can say they accept it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ..support.agent_configs import (
    HERMES_CONFIG,
    OPENCLAW_CONFIG,
    OPENCODE_JSONC,
    OPENCODE_OURS,
    connect_file,
)
from ..support.coding_agents import agent_env, install
from ..support.python_agents import agent_env as python_agent_env
from ..support.python_agents import install as pip_install
from ..support.python_agents import require

BASE_URL = "http://127.0.0.1:8000/v1"


@pytest.fixture(scope="module")
def npm_agents() -> dict[str, Path]:
    commands, why = install()
    require(Path() if commands else None, why)
    return commands


def connect(agent: str, path: Path, *more: str) -> None:
    flags = ["--base-url", BASE_URL, "--model", "smollm2-135m", "--key", "claw-key"]
    connect_file(agent, path, *flags, *more)


def read(
    command: list[str],
    home: Path,
    environment: Callable[..., dict[str, str]] = agent_env,
    **env: str,
) -> str:
    """What the agent printed, run in `home` with nothing of the developer's own settings."""
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(HOME=str(home), **env),
        cwd=home,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("context", ["8192", "131072"], ids=["small-profile", "full-profile"])
def test_openclaw_validates_what_connect_writes(
    npm_agents: dict[str, Path], tmp_path: Path, context: str
) -> None:
    path = tmp_path / "openclaw.json"
    path.write_text(json.dumps(OPENCLAW_CONFIG, indent=2))
    connect("openclaw", path, "--context", context)
    command = [str(npm_agents["openclaw"]), "config", "validate", "--json"]
    said = read(command, tmp_path, OPENCLAW_CONFIG_PATH=str(path))
    assert json.loads(said)["valid"] is True, said


def test_opencode_resolves_what_connect_writes(npm_agents: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / ".config" / "opencode" / "opencode.jsonc"
    path.parent.mkdir(parents=True)
    path.write_text(OPENCODE_JSONC)
    connect("opencode", path, "--context", "8192")
    said = read(
        [str(npm_agents["opencode"]), "debug", "config"],
        tmp_path,
        OPENCODE_DISABLE_AUTOUPDATE="1",
    )
    resolved = json.loads(said)
    assert resolved["model"] == "claw-stream/smollm2-135m"
    ours = resolved["provider"]["claw-stream"]
    assert ours["options"]["baseURL"] == BASE_URL
    assert ours["models"] == OPENCODE_OURS["models"]
    # the small-model profile's tools off, the user's own provider kept
    assert resolved["tools"]["webfetch"] is False and resolved["provider"]["ollama"]


def test_hermes_shows_what_connect_writes(tmp_path: Path) -> None:
    hermes = require(*pip_install("hermes"))
    path = tmp_path / ".hermes" / "config.yaml"
    path.parent.mkdir()
    path.write_text(HERMES_CONFIG)
    connect("hermes", path, "--context", "131072")
    said = read([str(hermes), "config", "show"], tmp_path, python_agent_env)
    assert "smollm2-135m" in said and BASE_URL in said
