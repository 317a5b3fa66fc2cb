"""`claw-stream connect gemini`: Gemini CLI's settings.json (auth type, model, compression
threshold, no usage statistics) and the .env beside it (base URL, key) merged, nothing else
changed, twice the same as once, a broken file left alone, and `--undo` putting both back byte
for byte (no gateway needed: --model). tests/e2e/test_gemini_cli.py runs Gemini CLI on what it
writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from claw_stream.agents import gemini
from claw_stream.agents.connect import BACKUP_SUFFIX, ORIGINAL_SUFFIX
from claw_stream.cli import main

FLAGS = ["--base-url", "http://127.0.0.1:8000", "--model", "smollm2-135m", "--context", "32768"]
SETTINGS = """{
    // mine: Gemini CLI reads comments
    "ui": {"theme": "Dracula"},
    "model": {"name": "gemini-2.5-pro", "maxSessionTurns": 10},
    "security": {"folderTrust": {"enabled": true}}
}
"""
ENV = """# my Gemini CLI
GEMINI_API_KEY=AIza-my-own
export DEBUG=1
"""


def connect(path: Path, *more: str) -> str:
    result = CliRunner().invoke(main, ["connect", "gemini", "--file", str(path), *FLAGS, *more])
    assert result.exit_code == 0, result.output
    return result.output


def test_settings_and_env_get_ours_and_keep_everything_else(tmp_path: Path) -> None:
    settings, env = tmp_path / "settings.json", tmp_path / ".env"
    settings.write_text(SETTINGS)
    env.write_text(ENV)
    out = connect(settings, "--key", "claw-key")
    written = json.loads(settings.read_text())
    assert written == {
        "ui": {"theme": "Dracula"},
        "model": {
            "name": "smollm2-135m",
            "maxSessionTurns": 10,
            # compress at half the served context: Gemini CLI counts 1,048,576 for this name
            "compressionThreshold": 0.015625,
        },
        "security": {"folderTrust": {"enabled": True}, "auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
    }
    assert settings.read_text().startswith('{\n    "ui"')  # its own indentation
    # the key rewritten where it stood, the base URL added; the rest as it was
    assert env.read_text() == (
        "# my Gemini CLI\nGEMINI_API_KEY=claw-key\nexport DEBUG=1\n"
        "GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8000\n"
    )
    assert "the backup has them" in out  # its comments are not kept
    assert (tmp_path / f"settings.json{BACKUP_SUFFIX}").read_text() == SETTINGS
    assert (tmp_path / f".env{BACKUP_SUFFIX}").read_text() == ENV
    assert "GEMINI_CLI_TRUST_WORKSPACE=true" in out  # what to do next
    # twice: nothing written
    before = settings.read_text(), env.read_text()
    assert "nothing changed" in connect(settings, "--key", "claw-key")
    assert (settings.read_text(), env.read_text()) == before


def test_print_shows_both_changes_and_writes_nothing(tmp_path: Path) -> None:
    settings = tmp_path / "gemini" / "settings.json"
    out = connect(settings, "--print")
    assert f"+++ {settings} (connected)" in out
    assert f"+++ {settings.parent / '.env'} (connected)" in out
    assert "+GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8000" in out
    assert "not written" in out and not settings.parent.exists()


def test_a_small_context_is_said_to_hold_no_gemini_cli_prompt(tmp_path: Path) -> None:
    out = connect(tmp_path / "settings.json", "--context", "8192")
    assert "8,192 tokens" in out and "claw-stream up --model" in out


def test_a_broken_settings_file_gets_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"
    settings.write_text('{"model": [')
    result = CliRunner().invoke(main, ["connect", "gemini", "--file", str(settings), *FLAGS])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {settings}: ") and line.endswith("(left untouched)")
    assert list(tmp_path.iterdir()) == [settings]  # no .env either


@pytest.mark.parametrize("with_env", [True, False], ids=["env-there", "no-env"])
def test_undo_puts_both_back_as_they_were_before_the_first_connect(
    tmp_path: Path, with_env: bool
) -> None:
    settings, env = tmp_path / "settings.json", tmp_path / ".env"
    settings.write_bytes(SETTINGS.encode())
    settings.chmod(0o600)
    if with_env:
        env.write_bytes(ENV.encode())
    connect(settings, "--key", "claw-key-1")
    connect(settings, "--key", "claw-key-2", "--model", "other", "--context", "131072")
    shown = connect(settings, "--undo", "--print")
    assert f"{settings} (before connect)" in shown and "not written" in shown
    out = connect(settings, "--undo")
    assert f"put {settings} back as it was before connect" in out
    assert settings.read_bytes() == SETTINGS.encode()  # comments and all
    assert settings.stat().st_mode & 0o777 == 0o600
    if with_env:
        assert env.read_bytes() == ENV.encode()
    else:
        assert f"removed {env}" in out and not env.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["settings.json", ".env"] if with_env else ["settings.json"]
    )
    # connected again, undone again: the same bytes
    connect(settings, "--key", "claw-key-3")
    connect(settings, "--undo")
    assert settings.read_bytes() == SETTINGS.encode()
    assert not (tmp_path / f"settings.json{ORIGINAL_SUFFIX}").exists()


def test_undo_of_files_connect_never_changed_is_refused(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"
    settings.write_text(SETTINGS)
    result = CliRunner().invoke(main, ["connect", "gemini", "--file", str(settings), "--undo"])
    assert result.exit_code == 1
    assert "nothing to undo" in result.output and str(settings) in result.output
    assert settings.read_text() == SETTINGS


def test_config_path_follows_gemini_cli_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_CLI_HOME", str(tmp_path))
    assert gemini.config_path() == tmp_path / ".gemini" / "settings.json"
    monkeypatch.delenv("GEMINI_CLI_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gemini.config_path() == tmp_path / "home" / ".gemini" / "settings.json"
