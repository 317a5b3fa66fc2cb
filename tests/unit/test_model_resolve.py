"""Model names: one not pulled yet, or neither registered nor a folder, is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.embedded.downloads import ModelError
from claw_stream.embedded.models import resolve_model


def test_unpulled_and_unknown_models_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="run `claw-stream models pull smollm2-135m`"):
        resolve_model("smollm2-135m", tmp_path)
    with pytest.raises(ModelError, match="neither a registered model"):
        resolve_model(str(tmp_path / "nowhere"), tmp_path)
    result = CliRunner().invoke(main, ["models", "pull", "gpt-17", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and "unknown model 'gpt-17'" in result.output


def test_every_command_that_serves_or_trains_takes_a_model_name() -> None:
    for command in ("up", "engine", "trainer"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0 and "--model" in result.output, command
    listed = CliRunner().invoke(main, ["models", "list", "--data-dir", "/nonexistent"])
    assert "smollm2-135m" in listed.output and "gemma3-270m" in listed.output
