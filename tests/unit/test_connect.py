"""`claw-stream connect`: our provider merged into a coding agent's own config file, nothing
else changed, twice the same as once, a broken file left alone (no gateway needed: --model)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.connect import BACKUP_SUFFIX, CODEX_KEY_ENV

CODEX_CONFIG = """# my own settings
model = "gpt-5"  # the usual one
approval_policy = "on-request"

[model_providers.azure]
name = "Azure"
base_url = "https://example.openai.azure.com/openai"
env_key = "AZURE_OPENAI_API_KEY"

[profiles.fast]
model = "o4-mini"
"""
CLAUDE_SETTINGS = {"permissions": {"allow": ["Bash(ls:*)"]}, "env": {"HTTPS_PROXY": "http://p"}}
FLAGS = ["--base-url", "http://127.0.0.1:8000/v1", "--model", "smollm2-135m", "--context", "8192"]


def connect(agent: str, path: Path, *more: str) -> str:
    result = CliRunner().invoke(main, ["connect", agent, "--file", str(path), *FLAGS, *more])
    assert result.exit_code == 0, result.output
    return result.output


def test_codex_gets_our_provider_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CODEX_CONFIG)
    connect("codex", path, "--key", "claw-key")
    config = tomllib.loads(path.read_text())
    assert config["model_providers"]["claw-stream"] == {
        "name": "claw-stream",
        "base_url": "http://127.0.0.1:8000/v1",
        "env_key": CODEX_KEY_ENV,
        "wire_api": "responses",
    }
    assert (config["model"], config["model_provider"], config["model_context_window"]) == (
        "smollm2-135m",
        "claw-stream",
        8192,
    )
    # the rest as it was, comments included; the file as it was kept beside it
    assert config["model_providers"]["azure"]["env_key"] == "AZURE_OPENAI_API_KEY"
    assert config["profiles"]["fast"] == {"model": "o4-mini"}
    assert config["approval_policy"] == "on-request"
    assert "# my own settings" in path.read_text() and "# the usual one" in path.read_text()
    assert (tmp_path / f"config.toml{BACKUP_SUFFIX}").read_text() == CODEX_CONFIG
    # twice: one entry, nothing written
    after = path.read_text()
    assert "nothing changed" in connect("codex", path, "--key", "claw-key")
    assert path.read_text() == after
    assert after.count("[model_providers.claw-stream]") == 1


def test_claude_code_gets_our_endpoint_in_its_env(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(CLAUDE_SETTINGS))
    out = connect("claude-code", path, "--key", "claw-key")
    settings = json.loads(path.read_text())
    assert settings["permissions"] == CLAUDE_SETTINGS["permissions"]
    env = settings["env"]
    assert env["HTTPS_PROXY"] == "http://p"
    # the root: Claude Code appends /v1/messages itself
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8000"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "claw-key"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "smollm2-135m"
    assert "wrote" in out
    assert "nothing changed" in connect("claude-code", path, "--key", "claw-key")


def test_print_shows_only_our_change_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CODEX_CONFIG)
    out = connect("codex", path, "--print")
    added = [line for line in out.splitlines() if line.startswith("+") and line[1:2] != "+"]
    assert "+[model_providers.claw-stream]" in added
    assert not any("azure" in line.lower() or "o4-mini" in line for line in added)
    assert path.read_text() == CODEX_CONFIG
    assert not (tmp_path / f"config.toml{BACKUP_SUFFIX}").exists()
    # a new file: created, with no backup
    fresh = tmp_path / "new" / "settings.json"
    connect("claude-code", fresh)
    assert json.loads(fresh.read_text())["env"]["ANTHROPIC_AUTH_TOKEN"] == "claw-stream"


@pytest.mark.parametrize(
    ("agent", "broken"),
    [
        ("codex", 'model = "x\n[model_providers'),
        ("claude-code", '{"env": ['),
        ("claude-code", "[1]"),
    ],
)
def test_a_broken_file_gets_one_line_and_is_left_untouched(
    tmp_path: Path, agent: str, broken: str
) -> None:
    path = tmp_path / "config"
    path.write_text(broken)
    result = CliRunner().invoke(main, ["connect", agent, "--file", str(path), *FLAGS])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {path}: ") and line.endswith("(left untouched)")
    assert path.read_text() == broken
    assert list(tmp_path.iterdir()) == [path]
