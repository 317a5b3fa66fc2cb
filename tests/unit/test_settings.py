"""Settings precedence: defaults < YAML file < CLAW_* environment < CLI flags; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.settings import ConfigError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "CLAW_KAFKA_BOOTSTRAP",
        "CLAW_DATABASE_URL",
        "CLAW_ADMIN_KEY",
        "CLAW_DATA_DIR",
        "CLAW_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "claw.yaml"
    config.write_text(
        "kafka_bootstrap: file:1\nadmin_key: from-file\ndatabase_url: postgresql+asyncpg://f/db\n"
    )
    assert load_settings(config).kafka_bootstrap == "file:1"
    monkeypatch.setenv("CLAW_KAFKA_BOOTSTRAP", "env:2")
    settings = load_settings(config)
    assert settings.kafka_bootstrap == "env:2"
    assert settings.admin_key == "from-file"
    assert load_settings(config, kafka_bootstrap="flag:3").kafka_bootstrap == "flag:3"
    # an unset flag (None) does not mask the environment
    assert load_settings(config, kafka_bootstrap=None).kafka_bootstrap == "env:2"


def test_config_from_env_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    monkeypatch.setenv("CLAW_CONFIG", str(config))
    assert load_settings().data_dir == tmp_path / "data"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("kafka_bootstrapp: x\n", "kafka_bootstrapp: Extra inputs are not permitted"),
        ("broker_port: many\n", "broker_port: Input should be a valid integer"),
        ("broker_port: 70000\n", "broker_port: Input should be less than or equal to 65535"),
        ("kafka_bootstrap: [\n", "is not valid YAML"),
    ],
)
def test_bad_config_names_the_setting(tmp_path: Path, text: str, words: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=words):
        load_settings(config)


def test_missing_config_file_is_a_clear_cli_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["settings", "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert "config file" in result.output and "does not exist" in result.output


def test_cli_prints_effective_settings(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("kafka_bootstrap: file:1\n")
    result = CliRunner().invoke(
        main, ["settings", "--config", str(config), "--database-url", "postgresql+asyncpg://x/y"]
    )
    assert result.exit_code == 0, result.output
    assert "kafka_bootstrap = file:1" in result.output
    assert "database_url = postgresql+asyncpg://x/y" in result.output


def test_kafka_is_short_for_kafka_bootstrap() -> None:
    for flag in ("--kafka", "--kafka-bootstrap"):
        result = CliRunner().invoke(main, ["settings", flag, "broker:9092"])
        assert result.exit_code == 0, result.output
        assert "kafka_bootstrap = broker:9092" in result.output


def test_admin_key_is_generated_once_per_data_dir(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path)
    key = settings.resolved_admin_key()
    assert key.startswith("claw-admin-") and len(key) > 30
    assert load_settings(data_dir=tmp_path).resolved_admin_key() == key
    assert (tmp_path / "admin_key").stat().st_mode & 0o077 == 0
    assert load_settings(data_dir=tmp_path, admin_key="mine").resolved_admin_key() == "mine"
